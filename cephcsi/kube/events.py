"""Record core/v1 Events about objects without ever blocking or failing the caller: a bounded queue,
one writer thread, aggregation of repeats (count+1) and a per-object rate limit. Events about
cluster-scoped objects go to namespace "default". Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import logging
import queue
import socket
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from kubernetes import client as k8s

from cephcsi.kube import apierrors
from cephcsi.kube.clock import SYSTEM_CLOCK, Clock, rfc3339_seconds
from cephcsi.kube.metrics import EVENTS_DROPPED, EVENTS_SENT
from cephcsi.kube.ratelimit import TokenBucket

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
_MAX_MESSAGE = 4096


@dataclass(frozen=True)
class ObjectReference:
    """The object an Event is about (core/v1 ObjectReference)."""

    kind: str
    """e.g. "PersistentVolumeClaim"."""
    name: str
    """metadata.name."""
    namespace: str = ""
    """metadata.namespace; "" for cluster-scoped objects."""
    uid: str = ""
    """metadata.uid (lets kubectl tie the Event to this incarnation of the name)."""
    api_version: str = ""
    """e.g. "v1"."""
    resource_version: str = ""
    """metadata.resourceVersion when the Event was recorded."""

    @classmethod
    def of(cls, obj: Any) -> ObjectReference:
        """From an informer dict, a typed client model or an ObjectReference; needs a kind."""
        if isinstance(obj, ObjectReference):
            return obj
        if isinstance(obj, Mapping):
            meta = obj.get("metadata") or {}
            ref = cls(str(obj.get("kind") or ""), str(meta.get("name") or ""), str(meta.get("namespace") or ""),
                      str(meta.get("uid") or ""), str(obj.get("apiVersion") or ""),
                      str(meta.get("resourceVersion") or ""))
        else:
            meta = getattr(obj, "metadata", None)
            ref = cls(str(getattr(obj, "kind", "") or ""), str(getattr(meta, "name", "") or ""),
                      str(getattr(meta, "namespace", "") or ""), str(getattr(meta, "uid", "") or ""),
                      str(getattr(obj, "api_version", "") or ""), str(getattr(meta, "resource_version", "") or ""))
        if not ref.kind or not ref.name:
            raise ValueError("an event target needs kind and metadata.name")
        return ref

    def to_api(self) -> dict[str, str]:
        """As the involvedObject field."""
        body = {"kind": self.kind, "name": self.name, "namespace": self.namespace, "uid": self.uid,
                "apiVersion": self.api_version, "resourceVersion": self.resource_version}
        return {k: v for k, v in body.items() if v}

    @property
    def event_namespace(self) -> str:
        """Where Events about this object live."""
        return self.namespace or "default"


@dataclass(frozen=True)
class EventSettings:
    """Event recorder behaviour."""

    component: str
    """source.component / reportingComponent, e.g. "rbd.csi.ceph.com" or "external-provisioner"."""
    host: str = field(default_factory=socket.gethostname)
    """source.host / reportingInstance."""
    queue_size: int = 1000
    """Events waiting to be written; more are dropped."""
    aggregation_window: float = 600.0
    """Seconds within which an identical event patches the previous one."""
    cache_size: int = 4096
    """Remembered distinct events (and per-object spam buckets)."""
    spam_burst: int = 25
    """Events per object allowed at once."""
    spam_interval: float = 300.0
    """After the burst, one more event per object per this many seconds."""
    request_timeout: float = 10.0
    """Timeout of one API call."""
    attempts: int = 3
    """Tries per event for transient API errors."""
    retry_delay: float = 1.0
    """Seconds between tries."""


EventKey = tuple[str, ...]


@dataclass(frozen=True)
class Decision:
    """What to do with one event."""

    action: str
    """"create", "patch" or "drop"."""
    key: EventKey
    """Aggregation key."""
    name: str = ""
    """Event object name (create: new, patch: existing)."""
    count: int = 1
    """count to write."""
    first_timestamp: datetime | None = None
    """firstTimestamp to write on create."""


@dataclass
class _Seen:
    name: str
    count: int
    first_timestamp: datetime
    last_seen: float


class EventCorrelator:
    """Aggregation and spam filtering decisions (pure logic; used by one thread)."""

    def __init__(self, *, window: float = 600.0, cache_size: int = 4096, spam_burst: int = 25,
                 spam_interval: float = 300.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.window = window
        self.cache_size = cache_size
        self.spam_burst = spam_burst
        self.spam_interval = spam_interval
        self._clock = clock
        self._seen: OrderedDict[EventKey, _Seen] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, ...], TokenBucket] = OrderedDict()

    @staticmethod
    def key(ref: ObjectReference, event_type: str, reason: str, message: str) -> EventKey:
        """Identical events share this key."""
        return (ref.kind, ref.namespace, ref.name, ref.uid, ref.api_version, event_type, reason, message)

    def decide(self, ref: ObjectReference, event_type: str, reason: str, message: str,
               at: datetime) -> Decision:
        """Create, patch (count+1) or drop; at is when the event happened.

        The first timestamp is the event's own time, not this (later) decision's: a repeat recorded before the
        worker reached the first one must not get a lastTimestamp earlier than the firstTimestamp.
        """
        key = self.key(ref, event_type, reason, message)
        if not self._bucket(ref).try_take():
            return Decision("drop", key)
        now = self._clock.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen.last_seen <= self.window:
            seen.count += 1
            seen.last_seen = now
            self._seen.move_to_end(key)
            return Decision("patch", key, seen.name, seen.count, seen.first_timestamp)
        name = f"{ref.name[:200]}.{uuid.uuid4().hex[:16]}"
        self._seen[key] = _Seen(name, 1, at, now)
        self._seen.move_to_end(key)
        while len(self._seen) > self.cache_size:
            self._seen.popitem(last=False)
        return Decision("create", key, name, 1, at)

    def forget(self, key: EventKey) -> None:
        """The Event behind key is gone or was never written; the next repeat creates one."""
        self._seen.pop(key, None)

    def _bucket(self, ref: ObjectReference) -> TokenBucket:
        object_key = (ref.kind, ref.namespace, ref.name, ref.uid)
        bucket = self._buckets.get(object_key)
        if bucket is None:
            bucket = TokenBucket(1.0 / self.spam_interval, self.spam_burst, clock=self._clock)
            self._buckets[object_key] = bucket
            while len(self._buckets) > self.cache_size:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(object_key)
        return bucket


@dataclass(frozen=True)
class _Request:
    ref: ObjectReference
    event_type: str
    reason: str
    message: str
    at: datetime


class EventRecorder:
    """Non-blocking Event writer; see the module docstring. Thread-safe."""

    def __init__(self, api_client: k8s.ApiClient | None, settings: EventSettings, *, clock: Clock = SYSTEM_CLOCK,
                 core_api: Any = None) -> None:
        """`core_api` replaces CoreV1Api(api_client) (tests pass a fake)."""
        self.settings = settings
        self._api = core_api if core_api is not None else k8s.CoreV1Api(api_client)
        self._clock = clock
        self._correlator = EventCorrelator(
            window=settings.aggregation_window, cache_size=settings.cache_size,
            spam_burst=settings.spam_burst, spam_interval=settings.spam_interval, clock=clock)
        self._queue: queue.Queue[_Request | None] = queue.Queue(settings.queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._pending = 0
        self._pending_cond = threading.Condition()

    def event(self, obj: Any, event_type: str, reason: str, message: str) -> None:
        """Record an event about obj (dict, typed model or ObjectReference). Never raises."""
        try:
            if event_type not in (NORMAL, WARNING):
                raise ValueError(f"event type must be {NORMAL} or {WARNING}, not {event_type!r}")
            request = _Request(ObjectReference.of(obj), event_type, reason, message[:_MAX_MESSAGE],
                               self._clock.wall())
            if self._stop.is_set():
                EVENTS_DROPPED.labels("stopped").inc()
                return
            self._ensure_started()
            with self._pending_cond:
                self._pending += 1
            try:
                self._queue.put_nowait(request)
            except queue.Full:
                self._done_one()
                EVENTS_DROPPED.labels("queue_full").inc()
                log.warning("event queue full; event dropped",
                            extra={"fields": {"reason": reason, "object": f"{request.ref.kind} {request.ref.name}"}})
        except Exception:  # noqa: BLE001 - recording an event must never break the caller
            EVENTS_DROPPED.labels("invalid").inc()
            log.exception("event not recorded", extra={"fields": {"reason": reason}})

    def flush(self, timeout: float) -> bool:
        """Wait until every queued event was written (or dropped); False on timeout."""
        with self._pending_cond:
            return self._pending_cond.wait_for(lambda: self._pending == 0, timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to timeout), then stop the thread; later events are dropped."""
        self.flush(timeout)
        self._stop.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- writer thread -----------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        while not self._stop.is_set():
            request = self._queue.get()
            if request is None:
                break
            try:
                self._write(request)
            except Exception:  # noqa: BLE001 - keep the writer alive
                log.exception("event writer failed", extra={"fields": {"reason": request.reason}})
            finally:
                self._done_one()

    def _done_one(self) -> None:
        with self._pending_cond:
            self._pending -= 1
            self._pending_cond.notify_all()

    def _write(self, request: _Request) -> None:
        decision = self._correlator.decide(request.ref, request.event_type, request.reason, request.message,
                                           request.at)
        if decision.action == "drop":
            EVENTS_DROPPED.labels("spam_filter").inc()
            log.debug("event dropped by the per-object spam filter", extra={"fields": {"reason": request.reason}})
            return
        if decision.action == "patch":
            try:
                self._with_retries(lambda: self._api.patch_namespaced_event(
                    decision.name, request.ref.event_namespace,
                    {"count": decision.count, "lastTimestamp": rfc3339_seconds(request.at)},
                    _request_timeout=self.settings.request_timeout))
                EVENTS_SENT.labels("patch").inc()
                return
            except Exception as exc:  # noqa: BLE001
                if not apierrors.is_not_found(exc):
                    self._failed(decision, request, exc)
                    return
                # The Event expired: start a new one with the accumulated count.
        try:
            body = self._body(request, decision)
            self._with_retries(lambda: self._api.create_namespaced_event(
                request.ref.event_namespace, body, _request_timeout=self.settings.request_timeout))
            EVENTS_SENT.labels("create").inc()
        except Exception as exc:  # noqa: BLE001
            self._failed(decision, request, exc)

    def _failed(self, decision: Decision, request: _Request, exc: BaseException) -> None:
        self._correlator.forget(decision.key)
        EVENTS_DROPPED.labels("api_error").inc()
        log.warning("event not written", extra={"fields": {"reason": request.reason, "error": repr(exc),
                                                "object": f"{request.ref.kind} {request.ref.name}"}})

    def _with_retries(self, call: Any) -> None:
        for attempt in range(1, self.settings.attempts + 1):
            try:
                call()
                return
            except Exception as exc:  # noqa: BLE001
                if attempt == self.settings.attempts or not apierrors.is_transient(exc) or self._stop.is_set():
                    raise
                self._stop.wait(self.settings.retry_delay)

    def _body(self, request: _Request, decision: Decision) -> dict[str, Any]:
        ref = request.ref
        first = decision.first_timestamp or request.at
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": decision.name, "namespace": ref.event_namespace},
            "involvedObject": ref.to_api(),
            "type": request.event_type,
            "reason": request.reason,
            "message": request.message,
            "count": decision.count,
            "firstTimestamp": rfc3339_seconds(first),
            "lastTimestamp": rfc3339_seconds(request.at),
            "source": {"component": self.settings.component, "host": self.settings.host},
            "reportingComponent": self.settings.component,
            "reportingInstance": self.settings.host,
        }
