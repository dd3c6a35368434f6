"""krbd: the kernel RBD client (`rbd device map --device-type krbd`), the production default.

The kernel keeps the mapping; it survives restarts of the plugin and of its container. The
`noudev` option (rbd CLI, Octopus+) is added when udev is not running on the node: without it
`rbd map` waits for udev events that never come (a known cause of hung maps, ceph-csi #507);
with it the CLI waits for the device node itself.

Read affinity (config.json `readAffinity`): `read_from_replica=localize` and the node's
`crush_location` come after `noudev` and before the StorageClass's mapOptions, and are left
out entirely when those set either key themselves (mappers/read_affinity.py).
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
