"""rbd-nbd: librbd in a userspace daemon behind the kernel nbd driver (`mounter: rbd-nbd`).

One daemon per image, in the plugin's container. Netlink-bound devices survive a plugin
restart (re-attached by cephcsi.node.nbd_healer); a device that cannot take a new size makes
NodeExpandVolume FAILED_PRECONDITION (`resize_blocked`). Defaults: `reattach-timeout=300`,
`exclusive` where it applies; no read affinity. ioctl vs netlink by release: docs/design/node.md.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable

from cephcsi.ceph.credentials import key_file
from cephcsi.errors import Internal
from cephcsi.node.exec import CommandFailed, Runner
from cephcsi.node.mappers.base import NBD, MapRequest
from cephcsi.node.mappers.nbd_attachments import Attachment, AttachmentStore
from cephcsi.node.mappers.options import merge
from cephcsi.node.mappers.rbd_cli import RbdDeviceMapper, image_args, translate
from cephcsi.node.stage_record import StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DEFAULT_MAP_OPTIONS = ["reattach-timeout=300"]
_SYS_BLOCK = "/sys/block"


class NbdMapper(RbdDeviceMapper):
    name = NBD
    device_type = "nbd"
    image_field = "image"
    exclusive_by_default = True

    def __init__(
        self,
        runner: Runner,
        timeout: float,
        wait_for_device: Callable[[str, float], None],
        device_timeout: float,
        log_dir: str = "",
        attachments: AttachmentStore | None = None,
        sys_block: str = _SYS_BLOCK,
    ) -> None:
        super().__init__(runner, timeout, wait_for_device, device_timeout)
        self.log_dir = log_dir
        self.attachments = attachments or AttachmentStore("")
        self.sys_block = sys_block

    def map_options(self, request: MapRequest) -> list[str]:
        return merge(DEFAULT_MAP_OPTIONS, list(request.options))

    def _log_file(self, volume_id: str) -> str:
        # The daemon outlives this call: give it a log file an admin can find, per volume.
        if not self.log_dir:
            return ""
        name = hashlib.sha256(volume_id.encode()).hexdigest()[:16]
        try:
            os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        except OSError:
            return ""  # logging to the default place beats failing the map
        return os.path.join(self.log_dir, f"rbd-nbd-{name}.log")

    def extra_map_args(self, request: MapRequest) -> list[str]:
        log_file = self._log_file(request.volume_id)
        return [f"--log-file={log_file}"] if log_file else []

    def mapped_new(self, request: MapRequest, device: str, options: list[str]) -> None:
        cookie = backend(device, self.sys_block)
        if not cookie:
            return  # ioctl-bound: dies with its daemon, nothing to re-attach
        self.attachments.save(Attachment(
            volume_id=request.volume_id, pool=request.image.pool,
            namespace=request.image.namespace, image=request.image.image, device=device, cookie=cookie,
            monitors=request.monitors, options=options, read_only=request.read_only,
            user_id=request.credentials.user_id, key=request.credentials.key,
            log_file=self._log_file(request.volume_id),
        ))

    def unmap(self, record: StageRecord) -> None:
        super().unmap(record)
        attachment = self.attachments.load(record.volume_id)
        if attachment is not None and self.waiting(attachment):
            # Its daemon died and nobody re-attached: the kernel still holds the device for the
            # rest of reattach-timeout. Disconnect it now rather than leave it to the timer.
            self.detach_dead(attachment)
        self.attachments.remove(record.volume_id)

    # -- re-attach after a restart (cephcsi.node.nbd_healer) ----------------------------------

    def waiting(self, attachment: Attachment) -> bool:
        """The kernel holds our netlink-bound device without a daemon serving it."""
        return backend(attachment.device, self.sys_block) == attachment.cookie and not self.served(attachment)

    def reattach_pending(self, volume_id: str) -> bool:
        """A re-attach record whose device still waits for a daemon (the healer's job)."""
        attachment = self.attachments.load(volume_id)
        return attachment is not None and not attachment.reattach_failed and self.waiting(attachment)

    def served(self, attachment: Attachment) -> bool:
        return self.device_of(attachment.image_spec) == attachment.device

    def reattach(self, attachment: Attachment) -> None:
        """A new rbd-nbd daemon on the waiting device, mapped as the first one was."""
        what = f"re-attach {attachment.device} ({attachment.image_spec}) with {self.name}"
        self.keys.check(attachment.credentials)
        with key_file(attachment.credentials) as keyfile:
            argv = ["rbd", "device", "attach", "--device-type", self.device_type, "--device", attachment.device,
                    # the cookie proves the device is the one this image was mapped on (rbd refuses without)
                    "--cookie", attachment.cookie, *image_args(attachment.image_spec), "--id", attachment.user_id, "-m", attachment.monitors,
                    f"--keyfile={keyfile}"]
            if attachment.log_file:
                argv.append(f"--log-file={attachment.log_file}")
            if attachment.read_only:
                argv.append("--read-only")
            if attachment.options:
                argv += ["--options", ",".join(attachment.options)]
            try:
                self.run(argv, what=what, timeout=self.timeout, secrets=(attachment.key,))
            except CommandFailed as error:
                raise translate(error, what, attachment.image_spec) from None
        if not self.served(attachment):
            raise Internal(f"{what}: rbd-nbd exited 0 but does not list {attachment.device} as serving the image")
        log.info("re-attached", extra=fields(volume_id=attachment.volume_id, device=attachment.device,
                                             image=str(attachment.image_spec), mapper=self.name))

    def detach_dead(self, attachment: Attachment) -> None:
        what = f"disconnect {attachment.device} ({attachment.image_spec}), whose rbd-nbd daemon is gone"
        try:
            self.run(["rbd", "device", "unmap", "--device-type", self.device_type, attachment.device],
                     what=what, timeout=self.timeout)
        except CommandFailed as error:
            # The kernel frees it when reattach-timeout ends; nothing reads or writes it meanwhile.
            log.warning("could not disconnect a device without its daemon; the kernel frees it when "
                        "reattach-timeout ends", extra=fields(device=attachment.device, error=str(error)))


def backend(device: str, sys_block: str = _SYS_BLOCK) -> str:
    """The backend identifier of a netlink-bound nbd device (rbd-nbd's cookie), '' for an
    ioctl-bound or unbound one."""
    name = os.path.basename(os.path.realpath(device))
    try:
        with open(os.path.join(sys_block, name, "backend"), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def netlink_bound(device: str, sys_block: str = _SYS_BLOCK) -> bool:
    """Whether the kernel bound `device` through the nbd netlink interface. Only netlink binds
    carry a backend identifier, which the kernel shows as /sys/block/nbdX/backend (rbd-nbd
    always passes its cookie there); an ioctl-bound device has no such file."""
    name = os.path.basename(os.path.realpath(device))
    return os.path.exists(os.path.join(sys_block, name, "backend"))


def resize_blocked(volume_id: str, device: str, size: int, required: int) -> str:
    """Why a netlink-bound device cannot reach `required` bytes, and how the user gets there."""
    return (
        f"volume {volume_id} is mapped by rbd-nbd at {device} through the kernel's nbd netlink interface, and "
        f"the device did not take the image's new size: it has {size} bytes, not the {required} requested "
        "(rbd-nbd 16.2 cannot resize a netlink-bound device; newer rbd-nbd, as in the cephcsi image, can). The "
        "volume comes up at its new size when it is staged again (stop the pods using it on this node and start "
        "them again); with rbd-nbd 16.2, StorageClasses without 'try-netlink' in mapOptions grow online"
    )
