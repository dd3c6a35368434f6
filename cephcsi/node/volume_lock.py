"""A volume's cluster-wide exclusive lock: ceph-csi's `<volume id>-mutexlock` cls_lock on the RADOS
object named after the volume id, taken and released with the `rados` tool.

Taken by key rotations and the first LUKS format; it lapses `duration` seconds after it was
taken (it cannot be renewed), and release breaks only this holder's cookie. docs/design/node.md.
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cephcsi.ceph.credentials import Credentials, key_file
from cephcsi.ceph.lock_names import rotation_lock_name
from cephcsi.errors import CephCSIError, Internal
from cephcsi.node.exec import CommandFailed, Result, Runner
from cephcsi.node.mappers.rbd_cli import translate
from cephcsi.node.stage_record import ImageSpec
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

LOCK_SECONDS = 600
"""The default lapse: far longer than a rotation, short enough that a dead holder does not block
the volume for long."""
_BUSY = "Device or resource busy"
_NO_OBJECT = re.compile(r"rados_lock_get_lock_info\(\): (\(2\) )?No such file or directory")
"""`rados lock info`'s own error line for ENOENT. Matched whole: every run also prints "can't open
ceph.conf: (2) No such file or directory" when there is none, and a missing pool says ENOENT too."""


@dataclass(frozen=True)
class ClusterLock:
    runner: Runner = field(repr=False)
    timeout: float
    image: ImageSpec
    monitors: str
    credentials: Credentials = field(repr=False)
    volume_id: str
    cookie: str
    description: str
    duration: int = LOCK_SECONDS

    def _run(self, args: list[str], what: str, ok_codes: tuple[int, ...] = (0,)) -> Result:
        pool = ["--pool", self.image.pool] + (["--namespace", self.image.namespace] if self.image.namespace else [])
        with key_file(self.credentials) as keyfile:
            try:
                return self.runner(["rados", *pool, "--id", self.credentials.user_id, "-m", self.monitors,
                                    f"--keyfile={keyfile}", *args], what=what, timeout=self.timeout,
                                   ok_codes=ok_codes, secrets=(self.credentials.key,))
            except CommandFailed as error:
                raise translate(error, what, self.image) from None

    def take(self) -> bool:
        """Take the lock; False when another locker holds it."""
        what = f"lock volume {self.volume_id}"
        result = self._run(["lock", "get", self.volume_id, rotation_lock_name(self.volume_id),
                            "--lock-type", "exclusive", "--lock-cookie", self.cookie, "--lock-duration", str(self.duration),
                            "--lock-description", self.description], what, ok_codes=(0, 1))
        if result.returncode == 0:
            return True
        if _BUSY in result.stderr:
            return False
        raise CommandFailed(result, what)

    def wait(self, seconds: float, interval: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> bool:
        """Take the lock, retrying while another holds it, for up to `seconds`; False if it never came."""
        return self.acquire(seconds, interval, sleep) is not None

    def acquire(self, seconds: float, interval: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> float | None:
        """wait(), returning when (by `clock`) the `lock get` that got the lock began, None if it
        never came. The lapse counts from the grant, which came after that: the earliest the
        lock can lapse is that reading plus `duration`."""
        deadline = clock() + seconds
        while True:
            started = clock()
            if self.take():
                return started
            if clock() + interval > deadline:
                return None
            sleep(interval)

    def lockers(self) -> list[dict[str, str]]:
        """The lock's holders; none when the lock's object does not exist (a lock never taken on
        this volume: on an existing object a lock nobody holds lists no lockers). Any other
        failure raises: read as "no lockers", a refused or timed-out read would make release()
        leave the lock held, silently."""
        what = f"read the lock of volume {self.volume_id}"
        result = self._run(["lock", "info", self.volume_id, rotation_lock_name(self.volume_id), "--format", "json"],
                           what, ok_codes=(0, 1))
        if result.returncode != 0:
            if _NO_OBJECT.search(result.stderr):
                return []
            raise translate(CommandFailed(result, what), what, self.image)
        try:
            found = json.loads(result.stdout).get("lockers", [])
            return [{key: str(value) for key, value in locker.items()} for locker in found]
        except (ValueError, AttributeError):
            raise Internal(f"`rados lock info` printed no lockers for volume {self.volume_id}") from None

    def break_locker(self, locker: str) -> None:
        self._run(["lock", "break", self.volume_id, rotation_lock_name(self.volume_id), locker,
                   "--lock-cookie", self.cookie],
                  f"release the lock of volume {self.volume_id}", ok_codes=(0, 1))

    def release(self) -> None:
        for locker in self.lockers():
            if locker.get("cookie") == self.cookie:
                self.break_locker(locker.get("name", ""))

    def release_or_lapse(self) -> None:
        """Release in a `finally`: a failure to release is logged, never raised, so it cannot hide
        the outcome of the work the lock guarded; the lock then lapses by itself after `duration`."""
        try:
            self.release()
        except CephCSIError as error:
            log.warning("the volume's lock could not be released; it lapses by itself",
                        extra=fields(volume_id=self.volume_id, error=error.message, lapse_seconds=self.duration))
