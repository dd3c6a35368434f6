"""rbd-nbd: librbd in a userspace daemon behind the kernel nbd driver (`mounter: rbd-nbd`).

Mapped with `rbd device map --device-type nbd`, which starts one rbd-nbd daemon per image.
Limits: the daemon lives in the plugin's container; if the container restarts, I/O on the
device stalls until the image is re-attached (ceph-csi re-attaches with cookies; this driver
does not yet), so rbd-nbd suits nodes without krbd rather than being a default.
Defaults: `try-netlink` (the netlink nbd interface survives daemon restarts better than the
ioctl one) and `reattach-timeout=300` (how long the kernel keeps the device for a
re-attaching daemon). User mapOptions with the same key replace a default.
config.json's readAffinity is not applied here, as in ceph-csi (it adds its read-affinity
options to krbd maps only); librbd's own `rbd_read_from_replica_policy` and `crush_location`
settings are the way for rbd-nbd, outside this driver.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

from cephcsi.node.exec import Runner
from cephcsi.node.mappers.base import NBD, MapRequest
from cephcsi.node.mappers.options import merge
from cephcsi.node.mappers.rbd_cli import RbdDeviceMapper

DEFAULT_MAP_OPTIONS = ["try-netlink", "reattach-timeout=300"]


class NbdMapper(RbdDeviceMapper):
    name = NBD
    device_type = "nbd"
    image_field = "image"

    def __init__(
        self,
        runner: Runner,
        timeout: float,
        wait_for_device: Callable[[str, float], None],
        device_timeout: float,
        log_dir: str = "",
    ) -> None:
        super().__init__(runner, timeout, wait_for_device, device_timeout)
        self.log_dir = log_dir

    def map_options(self, request: MapRequest) -> list[str]:
        return merge(DEFAULT_MAP_OPTIONS, list(request.options))

    def extra_map_args(self, request: MapRequest) -> list[str]:
        # The daemon outlives this call: give it a log file an admin can find, per volume.
        if not self.log_dir:
            return []
        name = hashlib.sha256(request.volume_id.encode()).hexdigest()[:16]
        try:
            os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        except OSError:
            return []  # logging to the default place beats failing the map
        return [f"--log-file={os.path.join(self.log_dir, f'rbd-nbd-{name}.log')}"]
