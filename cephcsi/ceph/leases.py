"""Short cls_lock leases that stay held while their holder lives, and lapse soon after it dies.

A cross-process lock on a volume must survive a slow Ceph call (so it cannot simply be short)
and must not block the volume for long after its holder is SIGKILLed (so it cannot simply be
long). Each lease is therefore taken for a few seconds and renewed by one keeper thread for as
long as the holding call runs; a dead process renews nothing, and its lease lapses within
`seconds`. Short calls (almost all) finish before the first renewal is due, so the keeper
costs them one dict insert and removal.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
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
    on_release: dict[str, str] = field(default_factory=dict)
    """omap values the holder wants written by the op that releases the lease (one round trip
    for both); dropped if the lease was lost meanwhile."""
    expires_at: float = 0.0
    """Monotonic time by which the OSD may have let the lock lapse: `seconds` after the start of
    the last lock or renewal op that succeeded (counted from the start: the OSD's clock may have
    begun before our reply arrived)."""

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


class LeaseKeeper:
    """Renews held leases at a third of their duration; one daemon thread, started lazily."""

    def __init__(self) -> None:
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, io: rados.Ioctx, obj: str, name: str, seconds: float, fill: Fill | None = None) -> Iterator[Lease | None]:
        """Yields the lease, or None (holding nothing) when another holder has it.

        With `fill`, the lease and the fill are one write op when the guard key is absent (the
        common case: a record this call reserved), else the lease alone (`Lease.filled` says)."""
        cookie = uuidlib.uuid4().hex
        filled = False
        started = time.monotonic()
        if fill is not None:
            outcome = omap.try_lock_and_fill(io, obj, name, cookie, seconds, fill.guard_key, fill.values)
            if outcome == "busy":
                yield None
                return
            filled = outcome == "filled"
        if not filled and not omap.try_lock(io, obj, name, cookie, seconds):
            yield None
            return
        lease = Lease(io, obj, name, cookie, seconds, time.monotonic() + seconds / 3, filled=filled,
                      expires_at=started + max(1, int(seconds)))
        self._add(lease)
        try:
            yield lease
        finally:
            with lease.guard:  # never unlock (or let the caller close `io`) mid-renewal
                lease.active = False
            with self._lock:
                self._leases.discard(lease)
            # One round trip saved per delete: cls_lock keeps the lock in the object's xattr, so
            # the removal (one atomic op) already released it; an unlock would only get ENOENT.
            # If someone recreated and locked the object since, our cookie is not theirs and an
            # unlock would change nothing either, so skipping it is equivalent.
            if lease.removed:
                pass
            elif lease.on_release:
                if not omap.update_and_unlock(io, obj, lease.on_release, name, cookie):
                    log.warning("a journal lease was lost before its release; values not written",
                                extra=fields(object=obj, keys=sorted(lease.on_release)))
            else:
                omap.unlock(io, obj, name, cookie)

    @contextmanager
    def removing(self, io: rados.Ioctx, obj: str) -> Iterator[None]:
        """Around the removal of `obj` by its lease holder (omap.remove_object calls this):
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


KEEPER = LeaseKeeper()
omap.set_removal_hook(KEEPER.removing)
