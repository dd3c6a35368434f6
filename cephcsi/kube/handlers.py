"""The informer's consumer side: event handlers, their registrations, and the dispatch thread.

Handlers run on a dispatch thread (`DispatchLoop`, shared by a factory's informers) fed by an
unbounded queue, so a slow handler delays other handlers but never the watch (which would otherwise fall behind and hit 410 Gone). Handlers
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


class DispatchLoop:
    """The thread that delivers the notes of one or more dispatchers (one per informer): the
    informer factory shares one among all its informers, so an idle controller runs one handler
    thread, not one per resource (issue 38). Notes of one dispatcher are delivered in the order
    posted; a slow handler of one informer delays the others' handlers, never a watch.
    The thread starts with the first member's start() and ends when the last member stopped."""

    def __init__(self, thread_name: str) -> None:
        self.thread_name = thread_name
        self._notes: queue.Queue[tuple[Dispatcher, Note]] = queue.Queue()
        self._lock = threading.Lock()
        self._members: list[Dispatcher] = []
        self._thread: threading.Thread | None = None

    def put(self, dispatcher: Dispatcher, note: Note) -> None:
        self._notes.put((dispatcher, note))

    def start(self, dispatcher: Dispatcher) -> None:
        """Deliver `dispatcher`'s notes from now on (starting the thread if none runs)."""
        with self._lock:
            if dispatcher not in self._members:
                self._members.append(dispatcher)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                members = tuple(self._members)
                if not members:
                    self._thread = None  # a later start() starts a new thread
                    return
            due = [d for d in (m.until_next_resync() for m in members) if d is not None]
            try:
                dispatcher, note = self._notes.get(timeout=min(due) if due else None)
            except queue.Empty:
                for member in members:
                    if not member.stopping:
                        member.resync_due()
                continue
            if note is _STOP:
                with self._lock:
                    if dispatcher in self._members:
                        self._members.remove(dispatcher)
                dispatcher.done.set()
                continue
            try:
                if not dispatcher.stopping:
                    dispatcher.deliver(note)
                for member in members:
                    if not member.stopping:
                        member.resync_due()
            except Exception:  # noqa: BLE001 - the thread serves every informer of the factory
                # deliver() already guards each handler; this is for anything else, so one bad
                # note cannot end the delivery (and the sync) of every other informer.
                log.exception("informer notification failed", extra={"fields": {"informer": dispatcher.name}})


class Dispatcher:
    """One informer's notification queue on a DispatchLoop (its own when none is given). The
    informer decides what to post and to whom (under its own lock, so delivery order is cache
    order); this class only delivers."""

    def __init__(self, name: str, store: Store, loop: DispatchLoop | None = None) -> None:
        self.name = name
        self._store = store
        self.loop = loop if loop is not None else DispatchLoop(f"informer-{name}-handlers")
        self.registrations: tuple[HandlerRegistration, ...] = ()
        self.synced = threading.Event()
        self.done = threading.Event()
        """Set once the loop handled stop(): no handler of this informer runs any more."""
        self._stopping = threading.Event()
        self._started = False

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def post(self, note: Note) -> None:
        """Queue a notification (callers hold the informer's lock)."""
        self.loop.put(self, note)

    def start(self) -> None:
        """Start delivering (the loop's thread starts if it is not running)."""
        self._started = True
        self.loop.start(self)

    def stop(self) -> None:
        """Deliver nothing more; `done` is set once a handler call in progress returned."""
        self._stopping.set()
        if not self._started:
            self.done.set()
            return
        self.loop.put(self, _STOP)

    def deliver(self, note: Note) -> None:
        """Deliver one note (the loop's thread)."""
        self._deliver(note)

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

    def until_next_resync(self) -> float | None:
        """Seconds until this dispatcher's next resync is due (None: no resync)."""
        due = [r.next_resync for r in self.registrations if r.next_resync is not None]
        if not due:
            return None
        return max(0.0, min(due) - time.monotonic())

    def resync_due(self) -> None:
        """Run every resync that is due (the loop's thread)."""
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
