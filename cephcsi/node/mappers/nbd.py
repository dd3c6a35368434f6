"""rbd-nbd: librbd in a userspace daemon behind the kernel nbd driver (`mounter: rbd-nbd`).

Mapped with `rbd device map --device-type nbd`, which starts one rbd-nbd daemon per image.
Limits: the daemon lives in the plugin's container; if the container restarts, I/O on the
device stalls until the image is re-attached (ceph-csi re-attaches with cookies; this driver
does not yet), so rbd-nbd suits nodes without krbd rather than being a default.

How the device is bound to the kernel — ioctl (the default here) or netlink — is a trade-off:
  * ioctl (rbd-nbd without `try-netlink`): the daemon holds the device with NBD_DO_IT and sets
    its size with NBD_SET_SIZE, also later: when the image grows, rbd-nbd sees the header
    change and the device follows within a fraction of a second, so NodeExpandVolume grows a
    mounted filesystem online. If the daemon dies, the kernel drops the device; it cannot be
    re-attached.
  * netlink (`mapOptions: "nbd:try-netlink"`; the kernel's nbd netlink interface, with a
    cookie in /sys/block/nbdX/backend): the kernel keeps the device for `reattach-timeout`
    seconds after the daemon dies, so a new daemon can re-attach (`rbd-nbd attach`), which
    the ioctl interface cannot do. But the kernel ignores a size in a netlink reconfigure and
    refuses NBD_SET_SIZE on a netlink-bound device (checked on Linux 6.1 with rbd-nbd 16.2.15:
    rbd-nbd logs "resize detected", the device keeps its old size): such a device takes a new
    size only when it is mapped again. NodeExpandVolume then answers FAILED_PRECONDITION saying
    so (`resize_blocked`), and the volume comes up at its new size when it is staged again.
Since this driver does not re-attach, netlink's advantage is unused and its cost is online
expansion, hence the ioctl default (ceph-csi maps with try-netlink). `reattach-timeout=300`
stays a default: it only matters with try-netlink, where it is how long the kernel waits for a
re-attaching daemon. User mapOptions with the same key replace a default.

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

DEFAULT_MAP_OPTIONS = ["reattach-timeout=300"]
_SYS_BLOCK = "/sys/block"


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


def netlink_bound(device: str, sys_block: str = _SYS_BLOCK) -> bool:
    """Whether the kernel bound `device` through the nbd netlink interface. Only netlink binds
    carry a backend identifier, which the kernel shows as /sys/block/nbdX/backend (rbd-nbd
    always passes its cookie there); an ioctl-bound device has no such file."""
    name = os.path.basename(os.path.realpath(device))
    return os.path.exists(os.path.join(sys_block, name, "backend"))


def resize_blocked(volume_id: str, device: str, size: int, required: int) -> str:
    """Why a netlink-bound device cannot reach `required` bytes, and how the user gets there."""
    return (
        f"volume {volume_id} is mapped by rbd-nbd at {device} through the kernel's nbd netlink interface "
        f"(mapOptions 'nbd:try-netlink'), and the kernel does not resize a connected netlink nbd device: it has "
        f"{size} bytes, not the {required} requested, and will keep them while mapped. The volume comes up at its "
        "new size when it is staged again (stop the pods using it on this node and start them again); StorageClasses "
        "without 'try-netlink' in mapOptions map rbd-nbd volumes so that they grow online"
    )
