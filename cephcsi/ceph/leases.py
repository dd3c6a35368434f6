"""Short cls_lock leases that stay held while their holder lives (renewed by one keeper thread) and
lapse within `seconds` after it dies. `Lease.release_behind` answers first and releases on the
keeper; other holds of that object in this process wait for it instead of answering ABORTED. Design:
docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import rados

from cephcsi.ceph import omap
from cephcsi.errors import CephCSIError, OperationInFlight
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fill:
    """omap values to write together with taking the lease, unless `guard_key` is present."""

    guard_key: str
    values: dict[str, str]


@dataclass(eq=False)
class Lease:
    io: rados.Ioctx
    obj: str
    name: str
    cookie: str
    seconds: float
    renew_at: float
    guard: threading.Lock = field(default_factory=threading.Lock)
    active: bool = True
    removed: bool = False
    """The holder removed the locked object under the lease: the lock went with it."""
    filled: bool = False
    """The Fill asked for was written by the same op that took the lease."""
    values: dict[str, str] | None = None
    """With `hold(read=True)`: the locked object's omap as the lock found it (None: nothing but
    what the lock created)."""
    on_release: dict[str, str | None] = field(default_factory=dict)
    """omap values the holder wants written by the op that releases the lease (one round trip
    for both; None removes the key); dropped if the lease was lost meanwhile."""
    behind: Callable[[rados.Ioctx], dict[str, str | None]] | None = None
    """Set by `release_behind`: the release happens after the holder has answered."""
    taken_at: float = 0.0
    """Monotonic time at which the op that took the lease was sent."""
    expires_at: float = 0.0
    """Monotonic time by which the OSD may have let the lock lapse: `seconds` after the start of
    the last lock or renewal op that succeeded (counted from the start: the OSD's clock may have
    begun before our reply arrived)."""

    def release_behind(self, values: Callable[[rados.Ioctx], dict[str, str | None]]) -> None:
        """Release the lease after the holder's call has answered, on a keeper thread, writing
        `values(io)` (more `on_release` values, e.g. read from another object) with the release.

        Only for bookkeeping nothing depends on once the holder answers: the release and those
        values. A process killed before they land leaves a lease that lapses within `seconds`
        and values unwritten, the state a kill just before an ordinary release leaves too.
        Another hold of the same object in this process waits for the release instead of
        finding it busy (`LeaseKeeper.hold`)."""
        self.behind = values

    def ensure_held(self) -> None:
        """Raise OperationInFlight once the lease may have lapsed (renewals failed for `seconds`,
        e.g. Ceph stopped answering): another process may own the volume by now, so the holder
        must not take its next step. The retry takes the lease anew and resumes from what the
        pool shows."""
        if time.monotonic() >= self.expires_at:
            raise OperationInFlight(
                f"lost the lease on journal entry {self.obj}: it could not be renewed for {self.seconds:g}s "
                "(Ceph did not answer in time); stopped before the next step, retry to resume"
            )


RELEASE_THREADS = 8
"""Threads releasing leases behind answers (`Lease.release_behind`), started on first use."""


class LeaseKeeper:
    """Renews held leases at a third of their duration; one daemon thread, started lazily.

    One per process, built by the composition root (cephcsi.cli.wiring's callers, the audit)
    and handed to everything that makes a `Journal`: holds of the same object must meet in the
    same keeper (`hold` waits for a release behind an answer), and the process drains it at exit."""

    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._releasing: dict[tuple[int, str, str], threading.Event] = {}
        """Objects whose lease is being released behind an answer (`Lease.release_behind`)."""
        self._releaser: ThreadPoolExecutor | None = None

    @contextmanager
    def hold(self, io: rados.Ioctx, obj: str, name: str, seconds: float, fill: Fill | None = None,
             read: bool = False, existing: bool = False) -> Iterator[Lease | None]:
        """Yields the lease, or None (holding nothing) when another holder has it.

        With `fill`, the lease and the fill are one write op when the guard key is absent (the
        common case: a record this call reserved), else the lease alone (`Lease.filled` says).
        With `read` (and no fill), the object's omap is read in the same round trip, ordered
        after the lock (`Lease.values`); with `existing` too, a missing object raises NotFound
        instead of being created by the lock."""
        self._await_release(io, obj, seconds)
        cookie = uuidlib.uuid4().hex
        filled = locked = False
        values: dict[str, str] | None = None
        started = time.monotonic()
        if fill is not None:
            outcome = omap.try_lock_and_fill(io, obj, name, cookie, seconds, fill.guard_key, fill.values)
            if outcome == "busy":
                yield None
                return
            filled = locked = outcome == "filled"
        elif read:
            locked, values = omap.try_lock_then_read(io, obj, name, cookie, seconds, existing)
            if not locked:
                yield None
                return
        if not locked and not omap.try_lock(io, obj, name, cookie, seconds):
            yield None
            return
        lease = Lease(io, obj, name, cookie, seconds, time.monotonic() + seconds / 3, filled=filled, values=values,
                      taken_at=started, expires_at=started + max(1, int(seconds)))
        self._add(lease)
        failed = False
        try:
            yield lease
        except BaseException:
            failed = True
            lease.behind = None  # a failed call answers after its release, as always
            raise
        finally:
            if lease.behind is not None:
                self._release_behind(lease)
            elif not self._release(lease) and not failed:
                # The values are the call's last journal step (a clone's image id, say): answering
                # success without them would leave a volume its record does not name, so the
                # caller retries instead, and the retry writes them.
                raise OperationInFlight(f"the journal lease on {obj} was lost before the call could record its "
                                        "outcome; retry")

    def _release(self, lease: Lease) -> bool:
        """Unlock, writing the lease's on-release values in the same op; False when the lease was
        lost before (the values are not written)."""
        with lease.guard:  # never unlock (or let the caller close `io`) mid-renewal
            lease.active = False
        with self._lock:
            self._leases.discard(lease)
        # One round trip saved per delete: cls_lock keeps the lock in the object's xattr, so
        # the removal (one atomic op) already released it; an unlock would only get ENOENT.
        # If someone recreated and locked the object since, our cookie is not theirs and an
        # unlock would change nothing either, so skipping it is equivalent.
        if lease.removed:
            return True
        if lease.on_release:
            if not omap.update_and_unlock(lease.io, lease.obj, lease.on_release, lease.name, lease.cookie):
                log.warning("a journal lease was lost before its release; values not written",
                            extra=fields(object=lease.obj, keys=sorted(lease.on_release)))
                return False
        else:
            omap.unlock(lease.io, lease.obj, lease.name, lease.cookie)
        return True

    @staticmethod
    def _key(io: rados.Ioctx, obj: str) -> tuple[int, str, str]:
        return io.get_pool_id(), io.get_namespace(), obj

    def _await_release(self, io: rados.Ioctx, obj: str, seconds: float) -> None:
        with self._lock:
            released = self._releasing.get(self._key(io, obj))
        if released is not None:
            released.wait(seconds)

    def _release_behind(self, lease: Lease) -> None:
        key = self._key(lease.io, lease.obj)
        released = threading.Event()
        # The holder closes its I/O context when it answers: the release gets its own.
        try:
            with lease.guard:
                lease.io = lease.io.dup()
        except rados.Error:
            self._finish(lease)  # released before the answer, as without release_behind
            return
        with self._lock:
            self._releasing[key] = released
            if self._releaser is None:
                # Each release is two round trips of waiting on the OSD; at 32 creates in
                # flight a couple of threads would fall behind and hold leases longer.
                self._releaser = ThreadPoolExecutor(max_workers=RELEASE_THREADS, thread_name_prefix="lease-release")
            releaser = self._releaser
        releaser.submit(self._finish_behind, lease, key, released)

    def _finish(self, lease: Lease) -> None:
        assert lease.behind is not None
        try:
            lease.on_release.update(lease.behind(lease.io))
        except CephCSIError as error:
            log.warning("values to write with a journal lease's release could not be read; released without them",
                        extra=fields(object=lease.obj, error=error.message))
        self._release(lease)

    def _finish_behind(self, lease: Lease, key: tuple[int, str, str], released: threading.Event) -> None:
        try:
            self._finish(lease)
        except CephCSIError as error:
            log.warning("could not release a journal lease; it lapses on its own",
                        extra=fields(object=lease.obj, seconds=lease.seconds, error=error.message))
        finally:
            lease.io.close()
            with self._lock:
                if self._releasing.get(key) is released:
                    del self._releasing[key]
            released.set()

    def drain(self, timeout: float) -> bool:
        """Wait (up to `timeout` seconds) for the releases behind answers still running; at a
        graceful stop, so the next process does not find leases that only lapse. True if none
        is left."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = list(self._releasing.values())
            if not pending:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            pending[0].wait(remaining)

    def remove_object(self, io: rados.Ioctx, obj: str) -> None:
        """`omap.remove_object` for an object a lease of this keeper may be held on (a journal
        record its holder deletes): see `removing`."""
        with self.removing(io, obj):
            omap.remove_object(io, obj)

    @contextmanager
    def removing(self, io: rados.Ioctx, obj: str) -> Iterator[None]:
        """Around the removal of `obj` by its lease holder (`remove_object`):
        renewals stop first, waiting out one in flight, so no renewal can land after the removal
        and recreate the object (cls_lock creates what it locks); once the removal succeeded the
        lease needs no unlock. A failed removal leaves `removed` False: the hold unlocks as usual."""
        with self._lock:
            held = [lease for lease in self._leases if lease.io is io and lease.obj == obj]
        for lease in held:
            lease.ensure_held()  # removing what another holder may own now would break its step
        for lease in held:
            with lease.guard:
                lease.active = False
        yield
        for lease in held:
            lease.removed = True

    def _add(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(0.5)
            now = time.monotonic()
            with self._lock:
                due = [lease for lease in self._leases if lease.renew_at <= now]
            for lease in due:
                self._renew(lease)

    @staticmethod
    def _renew(lease: Lease) -> None:
        with lease.guard:
            if not lease.active:
                return
            started = time.monotonic()
            try:
                omap.renew_lock(lease.io, lease.obj, lease.name, lease.cookie, lease.seconds)
            except CephCSIError as error:
                log.warning("could not renew a journal lease", extra=fields(object=lease.obj, error=error.message))
            else:
                lease.expires_at = started + max(1, int(lease.seconds))  # what the OSD was asked for
            lease.renew_at = time.monotonic() + lease.seconds / 3

