"""The informer's consumer side: event handlers, their registrations, and the dispatch thread.

Handlers run on one dispatch thread fed by an unbounded queue, so a slow handler delays other
handlers but never the watch (which would otherwise fall behind and hit 410 Gone). Handlers
should still be quick: they normally just add a key to a work queue. Periodic resync
re-delivers `on_update(obj, obj)` for every cached object, per handler.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from cephcsi.kube.store import KubeObject, Store, object_key

log = logging.getLogger(__name__)


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
class Note:
    """One notification for the dispatch thread: an add/update/delete for `targets`, or
    "synced" (the first list is delivered: every target and the informer are synced) or
    "handler_synced" (a late handler got the objects cached when it was added)."""

    kind: str
    targets: tuple[HandlerRegistration, ...]
    old: KubeObject | None = None
    new: KubeObject | None = None
    unknown: bool = False


_STOP = Note(kind="stop", targets=())


class Dispatcher:
    """The dispatch thread's queue and loop. The informer decides what to post and to whom
    (under its own lock, so delivery order is cache order); this class only delivers."""

    def __init__(self, name: str, store: Store) -> None:
        self.name = name
        self._store = store
        self._notes: queue.Queue[Note] = queue.Queue()
        self.registrations: tuple[HandlerRegistration, ...] = ()
        self.synced = threading.Event()
        self._stopping = threading.Event()

    def post(self, note: Note) -> None:
        """Queue a notification (callers hold the informer's lock)."""
        self._notes.put(note)

    def stop(self) -> None:
        """Make run() return after the notification it is delivering."""
        self._stopping.set()
        self._notes.put(_STOP)

    def run(self) -> None:
        """The dispatch thread's body: deliver notes in order, run resyncs when due."""
        while not self._stopping.is_set():
            try:
                note = self._notes.get(timeout=self._until_next_resync())
            except queue.Empty:
                self._resync_due()
                continue
            if note is _STOP or self._stopping.is_set():
                break
            self._deliver(note)
            self._resync_due()

    def _deliver(self, note: Note) -> None:
        if note.kind == "synced":
            now = time.monotonic()
            for reg in note.targets:
                reg.mark_synced(now)
            self.synced.set()
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
        due = [r.next_resync for r in self.registrations if r.next_resync is not None]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def _resync_due(self) -> None:
        now = time.monotonic()
        for reg in self.registrations:
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
