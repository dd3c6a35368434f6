"""The controller's side of a volume's rotation lock (ceph-csi's `<volume id>-mutexlock` cls_lock),
held with a duration from a snapshot's or clone's cut to its key copy; waited for `wait_seconds`,
then ABORTED. `Held.confirm` fails when the lock lapsed meanwhile. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import rados

from cephcsi.ceph import omap
from cephcsi.ceph.lock_names import rotation_lock_name
from cephcsi.ceph.errors import ceph_call, error_number
from cephcsi.errors import CephCSIError, NotFound, OperationInFlight

HOLD_SECONDS = 30
"""The lapse of a lock the controller holds: longer than a cut and a key copy take (seconds), and
short because a killed controller's lock also holds off its own retry (the CO's, under the
journal lease) until it lapses. Not renewed: a body slower than this loses the exclusion."""
WAIT_SECONDS = 10.0
"""How long a call waits for a rotation to finish before it answers ABORTED."""



def cookie(what: str) -> str:
    """Names the holder for `rados lock info`: this controller's host and a per-call token."""
    return f"cephcsi-controller {socket.gethostname()} {what} {uuid.uuid4().hex[:12]}"


def description(what: str) -> str:
    """The lock's description, which `rados lock info` and a refused `rotate-key` show: who holds
    it and for what."""
    return f"cephcsi controller {what} on {socket.gethostname()}"


class LockLapsed(OperationInFlight):
    """The rotation lock lapsed while the call held it: a rotation may have run in between."""


@dataclass(frozen=True)
class Held:
    """A rotation lock this call holds."""

    io: rados.Ioctx
    volume_id: str
    cookie: str
    description: str
    hold_seconds: int

    def confirm(self) -> None:
        """LockLapsed (ABORTED) unless the lock has been ours without a gap since it was taken;
        then it is ours for `hold_seconds` more."""
        if not omap.renew_held_lock(self.io, self.volume_id, rotation_lock_name(self.volume_id), self.cookie,
                                    self.hold_seconds, self.description):
            raise LockLapsed(f"the rotation lock of volume {self.volume_id} lapsed while this call held it "
                             f"(longer than {self.hold_seconds} s): a key rotation may have run meanwhile; retry")


@contextmanager
def held(io: rados.Ioctx, volume_id: str, what: str, wait_seconds: float = WAIT_SECONDS,
         hold_seconds: int = HOLD_SECONDS, interval: float = 0.5,
         sleep: Callable[[float], None] = time.sleep) -> Iterator[Held]:
    """Hold volume `volume_id`'s rotation lock for the body (`what` says why, in its cookie and
    description)."""
    name, mine, said = rotation_lock_name(volume_id), cookie(what), description(what)
    deadline = time.monotonic() + wait_seconds
    while not omap.try_lock(io, volume_id, name, mine, hold_seconds, said):
        if time.monotonic() + interval > deadline:
            raise OperationInFlight(f"volume {volume_id}'s rotation lock is held by {holder(io, volume_id)}; retry")
        sleep(interval)
    try:
        yield Held(io, volume_id, mine, said, hold_seconds)
    finally:
        _release(io, volume_id, name, mine)


def holder(io: rados.Ioctx, volume_id: str) -> str:
    """Who holds the lock, as its holder described itself (for a refusal's message)."""
    try:
        with ceph_call("read object lock", f"object {volume_id!r}"):
            raw = io.execute(volume_id, "lock", "get_info", omap.lock_info_request(rotation_lock_name(volume_id)))
    except CephCSIError:
        return "another holder (its description could not be read)"
    described = omap.lock_descriptions(raw[1] if isinstance(raw, tuple) else raw)
    if not described:
        return "another holder (it released the lock meanwhile)"
    return ", ".join(repr(text) if text else "a holder that gave no description" for text in described)


def _release(io: rados.Ioctx, volume_id: str, name: str, mine: str) -> None:
    with ceph_call("unlock object", f"object {volume_id!r}"):
        try:
            io.unlock(volume_id, name, mine)
        except rados.Error as error:
            # Lapsed already (the body outlived the duration) and perhaps taken by another: not ours.
            if error_number(error) != errno.ENOENT:
                raise


def remove_object(io: rados.Ioctx, volume_id: str) -> None:
    """After a deleted volume's image is gone: remove the empty object its rotation lock lives on
    (cls_lock keeps it after the last unlock, so each encrypted volume would leave one for ever).
    Taken first, so the removal cannot pull the object from under a holder (a rotation of the
    volume being deleted keeps it and its lock; the audit or nothing cleans it later). A missing
    object is not created by the attempt."""
    try:
        locked, _ = omap.try_lock_then_read(io, volume_id, rotation_lock_name(volume_id), cookie("delete"),
                                            HOLD_SECONDS, existing=True)
    except NotFound:
        return
    if locked:
        omap.remove_object(io, volume_id)
