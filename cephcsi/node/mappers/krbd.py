"""krbd: the kernel RBD client (`rbd device map --device-type krbd`), the production default.

The mapping lives in the kernel and survives plugin restarts. Options: `noudev` when udev is
not running, then read affinity (mappers/read_affinity.py), then the StorageClass's mapOptions.
docs/design/node.md, "krbd".
"""
from __future__ import annotations

from collections.abc import Callable

from cephcsi.node.exec import Runner
from cephcsi.node.mappers import read_affinity
from cephcsi.node.mappers.base import KRBD, MapRequest
from cephcsi.node.mappers.options import merge
from cephcsi.node.mappers.rbd_cli import RbdDeviceMapper
from cephcsi.node.stage_record import StageRecord


class KrbdMapper(RbdDeviceMapper):
    name = KRBD
    device_type = "krbd"

    def __init__(
        self,
        runner: Runner,
        timeout: float,
        wait_for_device: Callable[[str, float], None],
        device_timeout: float,
        udev_running: Callable[[], bool],
    ) -> None:
        super().__init__(runner, timeout, wait_for_device, device_timeout)
        self.udev_running = udev_running

    def _udev_options(self) -> list[str]:
        return [] if self.udev_running() else ["noudev"]

    def map_options(self, request: MapRequest) -> list[str]:
        affinity = read_affinity.map_options(request.crush_location, request.options)
        return merge(self._udev_options() + affinity, list(request.options))

    def unmap_options(self, record: StageRecord) -> list[str]:
        return merge(self._udev_options(), list(record.unmap_options))
