"""The informer's producer side: list, then watch from the list's resourceVersion, for ever
(client-go's reflector contract: resume, backoff, relist on 410 Gone). Objects are plain JSON
dicts with `kind`/`apiVersion` filled in, slimmed by `projection.Projection` (managedFields and
other unread bulk dropped, repeated pieces shared). JSON is decoded with orjson: pages of a
20,000-claim list decode in half json's time, and its key cache shares every dict key.
Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol

import orjson

from cephcsi.kube import apierrors
from cephcsi.kube.backoff import Backoff, BackoffSettings
from cephcsi.kube.metrics import INFORMER_LISTS, INFORMER_WATCH_ERRORS, INFORMER_WATCHES
from cephcsi.kube.projection import Projection
from cephcsi.kube.store import KubeObject, resource_version

log = logging.getLogger(__name__)


class RawResponse(Protocol):
    """What the reflector uses of the urllib3 response a list or watch call returns: the client's
    list functions are always called with `_preload_content=False`, so they return the raw
    response (urllib3.BaseHTTPResponse) and the reflector decodes the JSON itself."""

    @property
    def data(self) -> bytes: ...

    def stream(self, amt: int | None = ..., decode_content: bool = ...) -> Iterator[bytes]: ...

    def release_conn(self) -> None: ...

    def close(self) -> None: ...


ListFunc = Callable[..., RawResponse]
"""A list function of the kubernetes client (or a functools.partial binding its namespace),
called with keyword arguments only (limit, watch, resource_version, _preload_content=False, ...)."""


@dataclass(frozen=True)
class InformerSettings:
    """Timings of one informer (resync for its handlers, the rest for its reflector)."""

    resync_period: float = 0.0
    """Default period (seconds) of resync for handlers that do not set their own; 0 = never."""
    watch_timeout: float = 300.0
    """Server-side watch timeout is drawn from [watch_timeout, 2*watch_timeout) seconds."""
    inactivity_timeout: float = 150.0
    """Reconnect when the watch delivers nothing (not even a bookmark) for this long."""
    connect_timeout: float = 10.0
    """Seconds to connect for list and watch requests."""
    list_timeout: float = 60.0
    """Read timeout of one list page."""
    page_size: int = 500
    """Objects per list page."""
    allow_bookmarks: bool = True
    """Ask for BOOKMARK events (cheap progress markers that keep resourceVersion fresh)."""
    backoff: BackoffSettings = BackoffSettings()
    """Delays between failed list/watch attempts."""
    min_watch_duration: float = 1.0
    """A watch that ends sooner than this with no events counts as a failure (backs off)."""


class CacheSink(Protocol):
    """Where the reflector puts what it reads (the informer's cache)."""

    def replace(self, items: list[KubeObject], resource_version: str) -> None:
        """A complete list: the cache becomes exactly these objects."""

    def apply(self, event_type: str, obj: KubeObject) -> None:
        """One ADDED, MODIFIED or DELETED watch event."""


@dataclass(frozen=True)
class Selectors:
    """Server-side filters of the list and watch calls."""

    label_selector: str | None = None
    field_selector: str | None = None

    def kwargs(self) -> dict[str, Any]:
        """The selectors as keyword arguments of a kubernetes-client list function."""
        kwargs: dict[str, Any] = {}
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        return kwargs


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class _WatchFailed(Exception):
    """The watch stream carried an ERROR event other than 410."""


class _TooShort(Exception):
    """The watch ended almost at once without events."""


class _Stopped(Exception):
    """stop() was called in the middle of a list."""


# After this many consecutive failed watches the reflector lists again instead of resuming:
# an error that repeats (e.g. "resourceVersion too large" after a restore) will not go away
# by resuming from the same resourceVersion.
_RELIST_AFTER_FAILURES = 5


class Reflector:
    """List+watch one resource into a CacheSink until stopped; docs/design/kubernetes-machinery.md."""

    def __init__(self, list_func: ListFunc, sink: CacheSink, *, name: str, settings: InformerSettings,
                 selectors: Selectors, stop: threading.Event, projection: Projection | None = None) -> None:
        self.name = name
        self._project = projection if projection is not None else Projection()
        self.settings = settings
        self.selectors = selectors
        self._list_func = list_func
        self._sink = sink
        self._stop = stop
        self._response_lock = threading.Lock()
        self._response: RawResponse | None = None
        self._backoff = Backoff(settings.backoff)
        self._rng = random.Random()
        self.last_rv = ""
        """resourceVersion of the last list, watch event or bookmark."""

    def run(self) -> None:
        """The watch thread's body: list, watch until a relist is needed, repeat until stopped."""
        while not self._stop.is_set():
            try:
                rv = self._list()
            except Exception as exc:  # noqa: BLE001 - every failure is retried
                if self._stop.is_set():
                    break
                delay = self._backoff.next_delay()
                log.warning("list failed; retrying", extra={"fields": {
                    "informer": self.name, "error": repr(exc), "retry_in": round(delay, 2)}})
                self._stop.wait(delay)
                continue
            self._watch_until_relist(rv)

    def interrupt(self) -> None:
        """Unblock a watch read in progress (after the stop event is set)."""
        with self._response_lock:
            if self._response is not None:
                _interrupt(self._response)

    def _list(self) -> str:
        INFORMER_LISTS.labels(self.name).inc()
        items: list[KubeObject] = []
        token: str | None = None
        rv = ""
        while True:
            kwargs = self.selectors.kwargs()
            kwargs.update(limit=self.settings.page_size, _preload_content=False,
                          _request_timeout=(self.settings.connect_timeout, self.settings.list_timeout))
            if token:
                kwargs["_continue"] = token
            response = self._list_func(**kwargs)
            try:
                body = orjson.loads(response.data)
            finally:
                response.release_conn()
            kind, api_version = _item_type(body)
            for item in body.get("items") or []:
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", api_version)
                self._project(item)
                items.append(item)
            meta = body.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                break
            if self._stop.is_set():
                raise _Stopped("stopped during a paged list")  # never cache half a list
        # Before the sink hears of it: a reader who saw has_synced() also sees this list's version.
        self.last_rv = rv
        self._sink.replace(items, rv)
        return rv

    def _watch_until_relist(self, rv: str) -> None:
        failures = 0
        while not self._stop.is_set():
            # Resume from the newest resourceVersion seen, also when the last watch broke.
            rv = self.last_rv or rv
            try:
                rv = self._watch_once(rv)
                failures = 0
            except _Expired:
                INFORMER_WATCH_ERRORS.labels(self.name, "expired").inc()
                log.info("watch resourceVersion expired; relisting",
                         extra={"fields": {"informer": self.name, "resource_version": rv}})
                return
            except Exception as exc:  # noqa: BLE001 - classified below
                if self._stop.is_set():
                    return
                failures += 1
                resume = (apierrors.is_transient(exc) or isinstance(exc, (_TooShort, ValueError))) \
                    and failures < _RELIST_AFTER_FAILURES
                reason = _error_reason(exc)
                INFORMER_WATCH_ERRORS.labels(self.name, reason).inc()
                delay = self._backoff.next_delay()
                log.warning("watch failed; %s", "resuming" if resume else "relisting", extra={"fields": {
                    "informer": self.name, "error": repr(exc), "reason": reason,
                    "retry_in": round(delay, 2), "resource_version": rv}})
                self._stop.wait(delay)
                if not resume:
                    return

    def _open_watch(self, rv: str) -> RawResponse | None:
        """Start a watch request; None when stop() ran while it was in flight."""
        s = self.settings
        timeout_seconds = int(s.watch_timeout * (1.0 + self._rng.random()))
        kwargs = self.selectors.kwargs()
        kwargs.update(watch=True, resource_version=rv, timeout_seconds=max(1, timeout_seconds),
                      _preload_content=False, _request_timeout=(s.connect_timeout, s.inactivity_timeout))
        if s.allow_bookmarks:
            kwargs["allow_watch_bookmarks"] = True
        INFORMER_WATCHES.labels(self.name).inc()
        response = self._list_func(**kwargs)
        with self._response_lock:
            if self._stop.is_set():
                # stop() ran while the request was in flight and could not interrupt it.
                response.close()
                return None
            self._response = response
        return response

    def _watch_once(self, rv: str) -> str:
        started = time.monotonic()
        response = self._open_watch(rv)
        if response is None:
            return rv
        events = 0
        try:
            for event in _watch_events(response):
                if self._stop.is_set():
                    return rv
                rv = self._apply(event, rv)
                events += 1
        except Exception as exc:
            if apierrors.is_timeout(exc) and not self._stop.is_set():
                # A quiet watch: no event or bookmark within inactivity_timeout. Not an error
                # by itself; reconnecting proves the server is still there.
                INFORMER_WATCH_ERRORS.labels(self.name, "inactive").inc()
                log.info("watch inactive; reconnecting", extra={"fields": {
                    "informer": self.name, "inactivity_timeout": self.settings.inactivity_timeout}})
                return rv
            raise
        finally:
            with self._response_lock:
                self._response = None
            response.close()
        elapsed = time.monotonic() - started
        if events == 0 and elapsed < self.settings.min_watch_duration and not self._stop.is_set():
            raise _TooShort(f"watch ended after {elapsed:.2f}s without events")
        return rv

    def _apply(self, event: Mapping[str, Any], rv: str) -> str:
        etype = str(event.get("type"))
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Expired(str(obj.get("message", "")))
            raise _WatchFailed(f"watch error {code}: {obj.get('message', '')}")
        new_rv = resource_version(obj) or rv
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            self._project(obj)
            self._sink.apply(etype, obj)
        elif etype != "BOOKMARK":
            log.warning("unknown watch event type", extra={"fields": {"informer": self.name, "type": etype}})
        self.last_rv = new_rv
        return new_rv


def _item_type(body: Mapping[str, Any]) -> tuple[str, str]:
    kind = str(body.get("kind") or "")
    return (kind[: -len("List")] if kind.endswith("List") else kind), str(body.get("apiVersion") or "")


def _watch_events(response: RawResponse) -> Iterator[dict[str, Any]]:
    """Decode the newline-delimited JSON of a watch response as it arrives."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        while True:
            line, sep, rest = buffer.partition(b"\n")
            if not sep:
                break
            buffer = rest
            if line.strip():
                yield _loads(line)
    if buffer.strip():
        yield _loads(buffer)


def _loads(data: bytes) -> dict[str, Any]:
    """One JSON document; ValueError (orjson.JSONDecodeError is one) when it is not JSON."""
    value = orjson.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"a watch event is a JSON object, not {type(value).__name__}")
    return value


def _interrupt(response: RawResponse) -> None:
    """Unblock a thread reading `response` (urllib3 >= 2.3 has shutdown(); close() otherwise)."""
    try:
        shutdown = getattr(response, "shutdown", None)
        if shutdown is not None:
            shutdown()
        else:
            response.close()
    except Exception:  # noqa: BLE001 - best effort; the read timeout bounds the wait anyway
        log.debug("could not interrupt watch response", exc_info=True)


def _error_reason(exc: BaseException) -> str:
    if isinstance(exc, _TooShort):
        return "too_short"
    if isinstance(exc, _WatchFailed):
        return "error_event"
    if apierrors.is_timeout(exc):
        return "timeout"
    code = apierrors.status_code(exc)
    if code is not None:
        return f"http_{code}"
    if isinstance(exc, ValueError):
        return "decode"
    return "connection"
