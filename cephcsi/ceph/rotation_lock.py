"""The controller's side of a volume's rotation lock: ceph-csi's exclusive cls_lock
`<volume id>-mutexlock` on the RADOS object named after the volume id, in the image's pool and
namespace — the lock `cephcsi rotate-key` (cephcsi.node.volume_lock) and ceph-csi's
RotateEncryptionKey hold while they change a volume's LUKS header and its KMS passphrase.

A snapshot cut from an encrypted volume copies the header (librbd's clone) and then the KMS
passphrase (copy_key); a rotation between the two leaves a copy whose header no passphrase it
was given opens. Holding this lock from the cut to the copy makes the two an atomic pair as far
as rotations are concerned.

Held through librados with a duration (a controller killed while holding it leaves a lock that
lapses by itself) and a cookie naming this controller and call; released in `finally`. A lock
held by someone else is waited for `wait_seconds`, then the call is refused with ABORTED so the
CO retries after the rotation.
"""
from __future__ import annotations

import errno
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import rados

from cephcsi.ceph import omap
from cephcsi.ceph.errors import ceph_call, error_number
from cephcsi.errors import OperationInFlight

HOLD_SECONDS = 30
"""The lapse of a lock the controller holds: longer than a cut and a key copy take (seconds), and
short because a killed controller's lock also holds off its own retry (the CO's, under the
journal lease) until it lapses. Not renewed: a body slower than this loses the exclusion."""
WAIT_SECONDS = 10.0
"""How long a call waits for a rotation to finish before it answers ABORTED."""


def lock_name(volume_id: str) -> str:
    """ceph-csi's (internal/rbd/encryption.go RotateEncryptionKey), as cephcsi.node.volume_lock's."""
    return f"{volume_id}-mutexlock"


def cookie(what: str) -> str:
    """Names the holder for `rados lock info`: this controller's host and a per-call token."""
    return f"cephcsi-controller {socket.gethostname()} {what} {uuid.uuid4().hex[:12]}"


@contextmanager
def held(io: rados.Ioctx, volume_id: str, what: str, wait_seconds: float = WAIT_SECONDS,
         hold_seconds: int = HOLD_SECONDS, interval: float = 0.5,
         sleep: Callable[[float], None] = time.sleep) -> Iterator[None]:
    """Hold volume `volume_id`'s rotation lock for the body (`what` says why, in its cookie)."""
    name, mine = lock_name(volume_id), cookie(what)
    deadline = time.monotonic() + wait_seconds
    while not omap.try_lock(io, volume_id, name, mine, hold_seconds):
        if time.monotonic() + interval > deadline:
            raise OperationInFlight(f"key rotation of volume {volume_id} in progress; retry")
        sleep(interval)
    try:
        yield
    finally:
        _release(io, volume_id, name, mine)


def _release(io: rados.Ioctx, volume_id: str, name: str, mine: str) -> None:
    with ceph_call("unlock object", f"object {volume_id!r}"):
        try:
            io.unlock(volume_id, name, mine)
        except rados.Error as error:
            # Lapsed already (the body outlived the duration) and perhaps taken by another: not ours.
            if error_number(error) != errno.ENOENT:
                raise
