"""Keep the fuse mapper's loop devices as large as their images, as krbd and rbd-nbd devices are.

One daemon thread sets the capacity of loop devices under the fuse work root whose backing file
grew (sysfs and stat only, no Ceph traffic); idempotent with NodeExpandVolume's same step.
docs/design/node.md, "Loop devices that follow their image".
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from cephcsi.errors import CephCSIError
from cephcsi.node import devices
from cephcsi.node.exec import Runner
from cephcsi.node.mappers.loops import loops_under
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

INTERVAL = 2.0
"""Seconds between sweeps: how long a grown Block volume may show its old size in a pod."""


class LoopCapacityFollower:
    def __init__(
        self,
        fuse_root: str,
        runner: Runner,
        timeout: float,
        interval: float = INTERVAL,
        loops: Callable[[str], list[tuple[str, str]]] = loops_under,
        size_of: Callable[[str], int] = devices.size_bytes,
    ) -> None:
        self.fuse_root = fuse_root
        self.run = runner
        self.timeout = timeout
        self.interval = interval
        self.loops = loops
        self.size_of = size_of
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fuse-loop-capacity", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + self.interval)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the follower must outlive any one bad sweep
                log.exception("fuse loop capacity sweep failed")

    def sweep(self) -> list[str]:
        """Set the capacity of every loop device whose backing file outgrew it; those devices."""
        grown: list[str] = []
        for device, backing in self.loops(self.fuse_root):
            try:
                file_bytes = os.stat(backing).st_size
                device_bytes = self.size_of(device)
            except OSError:
                continue  # detached meanwhile, or its rbd-fuse is gone: unstage deals with it
            if file_bytes <= device_bytes:
                continue
            try:
                self.run(["losetup", "--set-capacity", device], what=f"resize loop device {device} to its image",
                         timeout=self.timeout)
            except CephCSIError as error:
                log.warning("could not grow a loop device to its image's size; retried on the next sweep",
                            extra=fields(device=device, backing=backing, error=error.message))
                continue
            log.info("loop device grown to its image's size",
                     extra=fields(device=device, before=device_bytes, bytes=file_bytes))
            grown.append(device)
        return grown
