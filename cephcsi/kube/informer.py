"""Informer: keep a local cache of one resource in sync with the API server and tell handlers.

How it works (the same contract as client-go's reflector + shared informer):
- The watch thread lists the resource (paged, consistent read), replaces the cache, then watches
  from the list's resourceVersion. A watch that ends normally (server-side `timeoutSeconds`,
  drawn at random from [watch_timeout, 2*watch_timeout) so many clients do not reconnect
  together) or goes quiet for `inactivity_timeout` (client-side read timeout; bookmarks keep a
  healthy watch from going quiet) is resumed from the last seen resourceVersion. Connection
  errors, 5xx and 429 are retried with capped exponential backoff and jitter, resuming too
  (after 5 failures in a row, or any other HTTP error, the informer lists again instead).
  410 Gone / "too old resourceVersion" means events were lost: the informer lists again and
  diffs the result against the cache, so handlers see adds, updates, and deletes (with
  `final_state_unknown=True`, carrying the last cached object) for what changed meanwhile.
- Handlers run on a separate dispatch thread fed by an unbounded queue, so a slow handler delays
  other handlers but never the watch (which would otherwise fall behind and hit 410). Handlers
  should still be quick: they normally just add a key to a work queue.
- `has_synced()` turns true once the first list is cached AND its add notifications have been
  delivered, so workers started after `wait_for_sync` see every existing object.
- Periodic resync re-delivers `on_update(obj, obj)` for every cached object, per handler.

Objects are plain dicts decoded from JSON (`_preload_content=False`), not the client's typed
models: decoding into models costs several times more CPU and memory, drops fields the client
version does not know (bad when building an update from a cached object), and turns camelCase
into snake_case attributes that differ from every manifest and kubectl output. List items get
`kind` and `apiVersion` filled in (the API omits them in lists) so cached objects can be used as
event targets. Cached dicts are shared: treat them as read-only; deep-copy before modifying.

Limits: relists are consistent reads (no resourceVersion="0"), which cost the apiserver more
than a cache read but never go back in time; list results are diffed by resourceVersion, so a
relist does not re-deliver unchanged objects (resync is the tool for that).
"""
from __future__ import annotations

import builtins
import json
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol

from cephcsi.kube import apierrors
from cephcsi.kube.backoff import Backoff, BackoffSettings
from cephcsi.kube.metrics import INFORMER_ITEMS, INFORMER_LISTS, INFORMER_WATCH_ERRORS, INFORMER_WATCHES
from cephcsi.kube.store import IndexFunc, KubeObject, Store, object_key, resource_version

log = logging.getLogger(__name__)

class RawResponse(Protocol):
    """What the informer uses of the urllib3 response a list or watch call returns: the client's
    list functions are always called with `_preload_content=False`, so they return the raw
    response (urllib3.BaseHTTPResponse) and the informer decodes the JSON itself."""

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
    """Timings of one informer."""

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


@dataclass(frozen=True)
class EventHandler:
    """Callbacks for one consumer; unset callbacks are skipped."""

    on_add: Callable[[KubeObject], None] | None = None
    """A new object (also every existing object when the handler is added)."""
    on_update: Callable[[KubeObject, KubeObject], None] | None = None
    """(old, new); old is new on resync."""
    on_delete: Callable[[KubeObject, bool], None] | None = None
    """(last known object, final_state_unknown); the flag is True when the deletion was only
    noticed by a relist, so the object may be older than its final state."""
    resync_period: float | None = None
    """Resync period for this handler; None → the informer's default."""


def enqueue_handler(add: Callable[[str], None],
                    accept: Callable[[KubeObject], bool] | None = None,
                    resync_period: float | None = None) -> EventHandler:
    """A handler that passes the key of every added/updated/deleted object to `add` (usually a
    work queue's add), optionally only for objects `accept` returns True for."""

    def on_obj(obj: KubeObject) -> None:
        if accept is None or accept(obj):
            add(object_key(obj))

    return EventHandler(
        on_add=on_obj,
        on_update=lambda _old, new: on_obj(new),
        on_delete=lambda obj, _unknown: on_obj(obj),
        resync_period=resync_period,
    )


class HandlerRegistration:
    """Returned by Informer.add_handler; tells whether the handler got the initial objects."""

    def __init__(self, handler: EventHandler, resync_period: float) -> None:
        self.handler = handler
        self.resync_period = resync_period
        self._synced = threading.Event()
        self.removed = False
        self.next_resync: float | None = None

    def has_synced(self) -> bool:
        """True once every object cached at registration time was delivered as an add."""
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float) -> bool:
        """Block until has_synced() or timeout; return has_synced()."""
        return self._synced.wait(timeout)

    def mark_synced(self, now: float) -> None:
        """The informer delivered this handler's initial objects (dispatch thread only)."""
        if self.resync_period > 0 and self.next_resync is None:
            self.next_resync = now + self.resync_period
        self._synced.set()


@dataclass(frozen=True)
class _Note:
    """One notification for the dispatch thread."""

    kind: str
    targets: tuple[HandlerRegistration, ...]
    old: KubeObject | None = None
    new: KubeObject | None = None
    unknown: bool = False


_STOP = _Note(kind="stop", targets=())


class _Expired(Exception):
    """The watch's resourceVersion is too old (410): relist."""


class _WatchFailed(Exception):
    """The watch stream carried an ERROR event other than 410."""


class _TooShort(Exception):
    """The watch ended almost at once without events."""


class _Stopped(Exception):
    """stop() was called in the middle of a list."""


# After this many consecutive failed watches the informer lists again instead of resuming:
# an error that repeats (e.g. "resourceVersion too large" after a restore) will not go away
# by resuming from the same resourceVersion.
_RELIST_AFTER_FAILURES = 5


class Informer:
    """List+watch one resource into a Store and notify handlers; see the module docstring."""

    def __init__(self, list_func: ListFunc, *, name: str, settings: InformerSettings = InformerSettings(),
                 indexers: Mapping[str, IndexFunc] | None = None, label_selector: str | None = None,
                 field_selector: str | None = None) -> None:
        self.name = name
        self.settings = settings
        self.label_selector = label_selector
        self.field_selector = field_selector
        self._list_func = list_func
        self._store = Store(indexers)
        # Guards store mutation + enqueueing together, so notification order equals cache order
        # and a handler added concurrently sees each change exactly once.
        self._lock = threading.Lock()
        self._registrations: tuple[HandlerRegistration, ...] = ()
        self._notes: queue.Queue[_Note] = queue.Queue()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._listed = False  # first list cached and its "synced" note queued (under _lock)
        self._started = False
        self._threads: list[threading.Thread] = []
        self._response_lock = threading.Lock()
        self._response: RawResponse | None = None
        self._backoff = Backoff(settings.backoff)
        self._rng = random.Random()
        self._last_rv = ""

    # ---- cache reads --------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The cache (read it; only the informer writes it)."""
        return self._store

    def get(self, key: str) -> KubeObject | None:
        """Cached object by "namespace/name" (or "name"), or None. Read-only."""
        return self._store.get(key)

    def get_by_name(self, namespace: str, name: str) -> KubeObject | None:
        """Cached object by namespace ("" for cluster-scoped) and name, or None. Read-only."""
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[KubeObject]:
        """Every cached object. Read-only."""
        return self._store.list()

    def by_index(self, index_name: str, value: str) -> builtins.list[KubeObject]:
        """Cached objects with `value` in index `index_name`. Read-only."""
        return self._store.by_index(index_name, value)

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add named indexes (allowed before or after start)."""
        self._store.add_indexers(indexers)

    @property
    def last_sync_resource_version(self) -> str:
        """resourceVersion of the last list, watch event or bookmark."""
        return self._last_rv

    # ---- handlers ---------------------------------------------------------------------------------

    def add_handler(self, handler: EventHandler) -> HandlerRegistration:
        """Register handler; it first receives an add for every object already cached."""
        period = handler.resync_period if handler.resync_period is not None else self.settings.resync_period
        reg = HandlerRegistration(handler, period)
        with self._lock:
            existing = self._store.list()
            self._registrations = self._registrations + (reg,)
            for obj in existing:
                self._notes.put(_Note("add", (reg,), new=obj))
            if self._listed:
                self._notes.put(_Note("handler_synced", (reg,)))
        return reg

    def remove_handler(self, reg: HandlerRegistration) -> None:
        """Stop delivering to this handler."""
        with self._lock:
            reg.removed = True
            self._registrations = tuple(r for r in self._registrations if r is not reg)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watch and dispatch threads (idempotent)."""
        if self._started:
            return
        self._started = True
        for target, suffix in ((self._run_reflector, "watch"), (self._run_dispatcher, "handlers")):
            thread = threading.Thread(target=target, name=f"informer-{self.name}-{suffix}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop both threads and wait up to `timeout` seconds for them."""
        self._stop.set()
        with self._response_lock:
            if self._response is not None:
                _interrupt(self._response)
        self._notes.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def stopped(self) -> bool:
        """True once stop() was called."""
        return self._stop.is_set()

    def has_synced(self) -> bool:
        """True once the first list is cached and delivered to the handlers present then."""
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float) -> bool:
        """Block until has_synced() or timeout (or stop); return has_synced()."""
        deadline = time.monotonic() + timeout
        while not self._synced.is_set() and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._synced.wait(min(remaining, 0.1))
        return self._synced.is_set()

    # ---- watch thread ---------------------------------------------------------------------------

    def _run_reflector(self) -> None:
        while not self._stop.is_set():
            try:
                rv = self._list_and_replace()
            except Exception as exc:  # noqa: BLE001 - every failure is retried
                if self._stop.is_set():
                    break
                delay = self._backoff.next_delay()
                log.warning("list failed; retrying", extra={"fields": {
                    "informer": self.name, "error": repr(exc), "retry_in": round(delay, 2)}})
                self._stop.wait(delay)
                continue
            self._watch_until_relist(rv)

    def _list_and_replace(self) -> str:
        INFORMER_LISTS.labels(self.name).inc()
        items: list[KubeObject] = []
        token: str | None = None
        rv = ""
        while True:
            kwargs = self._selector_kwargs()
            kwargs.update(limit=self.settings.page_size, _preload_content=False,
                          _request_timeout=(self.settings.connect_timeout, self.settings.list_timeout))
            if token:
                kwargs["_continue"] = token
            response = self._list_func(**kwargs)
            try:
                body = json.loads(response.data)
            finally:
                response.release_conn()
            kind, api_version = _item_type(body)
            for item in body.get("items") or []:
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", api_version)
                items.append(item)
            meta = body.get("metadata") or {}
            rv = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                break
            if self._stop.is_set():
                raise _Stopped("stopped during a paged list")  # never cache half a list
        with self._lock:
            result = self._store.replace(items)
            targets = self._registrations
            for obj in result.added:
                self._notes.put(_Note("add", targets, new=obj))
            for old, new in result.updated:
                self._notes.put(_Note("update", targets, old=old, new=new))
            for old in result.deleted:
                self._notes.put(_Note("delete", targets, old=old, unknown=True))
            if not self._listed:
                self._listed = True
                self._notes.put(_Note("synced", targets))
        self._last_rv = rv
        INFORMER_ITEMS.labels(self.name).set(len(self._store))
        log.info("listed", extra={"fields": {"informer": self.name, "items": len(items), "resource_version": rv,
                                  "added": len(result.added), "updated": len(result.updated),
                                  "deleted": len(result.deleted)}})
        return rv

    def _watch_until_relist(self, rv: str) -> None:
        failures = 0
        while not self._stop.is_set():
            # Resume from the newest resourceVersion seen, also when the last watch broke.
            rv = self._last_rv or rv
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

    def _watch_once(self, rv: str) -> str:
        s = self.settings
        timeout_seconds = int(s.watch_timeout * (1.0 + self._rng.random()))
        kwargs = self._selector_kwargs()
        kwargs.update(watch=True, resource_version=rv, timeout_seconds=max(1, timeout_seconds),
                      _preload_content=False, _request_timeout=(s.connect_timeout, s.inactivity_timeout))
        if s.allow_bookmarks:
            kwargs["allow_watch_bookmarks"] = True
        INFORMER_WATCHES.labels(self.name).inc()
        started = time.monotonic()
        response = self._list_func(**kwargs)
        with self._response_lock:
            if self._stop.is_set():
                # stop() ran while the request was in flight and could not interrupt it.
                response.close()
                return rv
            self._response = response
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
                    "informer": self.name, "inactivity_timeout": s.inactivity_timeout}})
                return rv
            raise
        finally:
            with self._response_lock:
                self._response = None
            response.close()
        if events == 0 and time.monotonic() - started < s.min_watch_duration and not self._stop.is_set():
            raise _TooShort(f"watch ended after {time.monotonic() - started:.2f}s without events")
        return rv

    def _apply(self, event: Mapping[str, Any], rv: str) -> str:
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Expired(str(obj.get("message", "")))
            raise _WatchFailed(f"watch error {code}: {obj.get('message', '')}")
        new_rv = resource_version(obj) or rv
        if etype == "BOOKMARK":
            self._last_rv = new_rv
            return new_rv
        with self._lock:
            targets = self._registrations
            if etype in ("ADDED", "MODIFIED"):
                old = self._store.upsert(obj)
                if old is None:
                    self._notes.put(_Note("add", targets, new=obj))
                else:
                    self._notes.put(_Note("update", targets, old=old, new=obj))
            elif etype == "DELETED":
                self._store.delete(object_key(obj))
                self._notes.put(_Note("delete", targets, old=obj, unknown=False))
            else:
                log.warning("unknown watch event type", extra={"fields": {"informer": self.name, "type": etype}})
        self._last_rv = new_rv
        INFORMER_ITEMS.labels(self.name).set(len(self._store))
        return new_rv

    def _selector_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        return kwargs

    # ---- dispatch thread ---------------------------------------------------------------------------

    def _run_dispatcher(self) -> None:
        while not self._stop.is_set():
            try:
                note = self._notes.get(timeout=self._until_next_resync())
            except queue.Empty:
                self._resync_due()
                continue
            if note is _STOP or self._stop.is_set():
                break
            self._deliver(note)
            self._resync_due()

    def _deliver(self, note: _Note) -> None:
        if note.kind == "synced":
            now = time.monotonic()
            for reg in note.targets:
                reg.mark_synced(now)
            self._synced.set()
            return
        if note.kind == "handler_synced":
            note.targets[0].mark_synced(time.monotonic())
            return
        for reg in note.targets:
            if reg.removed:
                continue
            handler = reg.handler
            try:
                if note.kind == "add" and handler.on_add is not None and note.new is not None:
                    handler.on_add(note.new)
                elif note.kind == "update" and handler.on_update is not None and note.new is not None:
                    handler.on_update(note.old if note.old is not None else note.new, note.new)
                elif note.kind == "delete" and handler.on_delete is not None and note.old is not None:
                    handler.on_delete(note.old, note.unknown)
            except Exception:  # noqa: BLE001 - one bad handler must not stop the others
                log.exception("informer handler failed", extra={"fields": {"informer": self.name, "event": note.kind}})

    def _until_next_resync(self) -> float | None:
        due = [r.next_resync for r in self._registrations if r.next_resync is not None]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def _resync_due(self) -> None:
        now = time.monotonic()
        for reg in self._registrations:
            if reg.next_resync is None or reg.next_resync > now or reg.removed:
                continue
            reg.next_resync = now + reg.resync_period
            on_update = reg.handler.on_update
            if on_update is None:
                continue
            for obj in self._store.list():
                try:
                    on_update(obj, obj)
                except Exception:  # noqa: BLE001
                    log.exception("informer resync handler failed", extra={"fields": {"informer": self.name}})


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
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


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

