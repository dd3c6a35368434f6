"""NodeExpandVolume, and the same growth when a volume is staged (resize-on-stage): make a
grown image's new size visible through the mapper, then grow the filesystem on it.

Idempotent and stateless (the sizes on the system are the state); callers hold the node's
per-volume and per-path locks. A path holding no stage of the volume is NOT_FOUND; a device
that cannot take the new size is FAILED_PRECONDITION. Per-mapper behaviour, offline ext4 growth
and why: docs/design/node.md, "Growing a volume".
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cephcsi.errors import CephCSIError, FailedPrecondition, Internal, InvalidArgument, NotFound, Unavailable
from cephcsi.node import devices, filesystems, fssize, luks, mounts, stage_record
from cephcsi.node.exec import CommandFailed, Runner, tail
from cephcsi.node.mappers import nbd
from cephcsi.node.mappers.base import FUSE, NBD, Mapper
from cephcsi.node.mappers.fuse import backing_file
from cephcsi.node.stage_record import ACCESS_MOUNT, BLOCK_FILE, FS_DIR, StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

_POLL = 0.1
# How long a netlink-bound rbd-nbd device is watched for a new size before the answer says it
# will not come (a kernel that learns to resize them would pass here).
_NETLINK_GRACE = 2.0


@dataclass(frozen=True)
class NodeExpandRequest:
    volume_id: str
    volume_path: str
    staging_path: str = ""
    """'' when the CO did not send staging_target_path."""
    required_bytes: int = 0
    limit_bytes: int = 0
    access_type: str = ""
    """mount | block when the CO sent volume_capability, else ''."""


class NodeExpander:
    def __init__(
        self,
        mappers: Mapping[str, Mapper],
        runner: Runner,
        timeout: float,
        wait_seconds: float,
        read_mounts: Callable[[], list[mounts.MountEntry]] = mounts.read_mounts,
        size_of: Callable[[str], int] = devices.size_bytes,
        fs_size: Callable[[str, str], fssize.FsSize | None] = fssize.filesystem_size,
        sleep: Callable[[float], None] = time.sleep,
        device_numbers: Callable[[str], tuple[int, int]] = devices.device_numbers,
        netlink_bound: Callable[[str], bool] = nbd.netlink_bound,
        cryptsetup: luks.Luks | None = None,
    ) -> None:
        self.mappers = mappers
        self.run = runner
        self.timeout = timeout
        self.wait_seconds = wait_seconds
        self.read_mounts = read_mounts
        self.size_of = size_of
        self.fs_size = fs_size
        self.sleep = sleep
        self.device_numbers = device_numbers
        self.netlink_bound = netlink_bound
        self.cryptsetup = cryptsetup or luks.Luks(runner, timeout)

    # -- finding the staged volume -----------------------------------------------------------

    def locate(self, request: NodeExpandRequest) -> StageRecord:
        """The stage record of the volume at the request's paths, or NOT_FOUND."""
        if mounts.path_state(request.volume_path) == "missing":
            raise NotFound(f"volume_path {request.volume_path} does not exist on this node")
        if request.staging_path:
            record = self._record_at(request.staging_path, request.volume_id)
            self._check_volume_path(record, request.volume_path)
        else:
            record = self._record_from_mounts(request.volume_path, request.volume_id)
        if not record.staged:
            raise FailedPrecondition(
                f"volume {request.volume_id} is not completely staged at {record.staging_path} (an earlier stage "
                "failed or is being retried); stage it again before expanding it"
            )
        if request.access_type and request.access_type != record.access_type:
            raise InvalidArgument(
                f"volume_capability says {request.access_type}, but volume {request.volume_id} is staged as "
                f"{record.access_type}"
            )
        return record

    @staticmethod
    def _record_at(staging_path: str, volume_id: str) -> StageRecord:
        record = stage_record.load(staging_path) if os.path.isdir(staging_path) else None
        if record is None or record.volume_id != volume_id:
            raise NotFound(f"volume {volume_id} is not staged at {staging_path}")
        return record

    def _check_volume_path(self, record: StageRecord, volume_path: str) -> None:
        if volume_path in (record.staging_path, record.mount_path):
            return
        table = self.read_mounts()
        published = mounts.top_mount(volume_path, table)
        staged = mounts.top_mount(record.mount_path, table)
        if published is None or staged is None or published not in [staged, *mounts.mounts_sharing(staged, table)]:
            raise NotFound(f"{volume_path} is not a path where volume {record.volume_id} is staged or published")

    def _record_from_mounts(self, volume_path: str, volume_id: str) -> StageRecord:
        """Without a staging path: the path itself is the staging path, or one of the mounts
        sharing its mount is the volume's `<staging>/fs` or `<staging>/block`."""
        if os.path.isdir(volume_path) and stage_record.load(volume_path) is not None:
            return self._record_at(volume_path, volume_id)
        table = self.read_mounts()
        entry = mounts.top_mount(volume_path, table)
        if entry is not None:
            for candidate in [entry, *mounts.mounts_sharing(entry, table)]:
                if os.path.basename(candidate.mount_point) not in (FS_DIR, BLOCK_FILE):
                    continue
                staging = os.path.dirname(candidate.mount_point)
                record = stage_record.load(staging) if os.path.isdir(staging) else None
                if record is not None and record.volume_id == volume_id and record.mount_path == candidate.mount_point:
                    return record
        raise NotFound(f"no staged volume {volume_id} is mounted at {volume_path}")

    # -- growing -------------------------------------------------------------------------------

    def expand(self, record: StageRecord, request: NodeExpandRequest) -> int:
        """Grow the device and filesystem of a staged volume; the device's size in bytes."""
        device = self._device(record)
        size = self.sync_device(record, device, request.required_bytes)
        if request.limit_bytes and size > request.limit_bytes:
            raise InvalidArgument(
                f"volume {record.volume_id} already has {size} bytes, more than limit_bytes {request.limit_bytes}; "
                "volumes are never shrunk"
            )
        self.grow_filesystem(record, self.sync_mapping(record, device))
        log.info("volume expanded on the node", extra=fields(volume_id=record.volume_id, device=device, bytes=size))
        return size

    def after_stage(self, record: StageRecord) -> None:
        """Resize-on-stage: the image may have grown while the volume was not staged here.

        Best effort: a volume that cannot be grown here is still usable at its old size, so the
        stage goes on; the kubelet's NodeExpandVolume then reports why (e.g. a missing capability)."""
        try:
            self.sync_device(record, record.device, 0)
            self.grow_filesystem(record, self.sync_mapping(record, record.device))
        except CephCSIError as error:
            log.warning("could not grow the volume while staging it; it is staged at its old size",
                        extra=fields(volume_id=record.volume_id, error=error.message))

    def before_mount(self, record: StageRecord) -> None:
        """Resize-on-stage of an unmounted ext4 (see the module docstring); best effort, like
        `after_stage`, which grows what this leaves (xfs, or an ext4 a check refused) online."""
        if record.access_type != ACCESS_MOUNT or record.read_only or record.fs_type != "ext4":
            return
        try:
            self.sync_device(record, record.device, 0)
            device = self.sync_mapping(record, record.device)
            device_bytes = self.size_of(device)
            size = self.fs_size(device, record.fs_type)
            if size is None or size.fills(device_bytes):
                return  # not ext4 after all (the mount step says so) or nothing to grow
            what = f"check the ext4 filesystem of volume {record.volume_id} before growing it"
            # Exit 1: errors found and fixed; 2: fixed, "reboot" (about a mounted root only).
            self.run(["e2fsck", "-f", "-p", device], what=what, timeout=self.timeout, ok_codes=(0, 1, 2))
            self.run(["resize2fs", device], what=f"grow the ext4 filesystem of volume {record.volume_id}",
                     timeout=self.timeout)
        except CephCSIError as error:
            log.warning("could not grow the filesystem before mounting it; trying online after the mount",
                        extra=fields(volume_id=record.volume_id, error=error.message))
            return
        log.info("filesystem grown before mounting", extra=fields(volume_id=record.volume_id, fs_type=record.fs_type,
                                                                  before=size.bytes, device_bytes=device_bytes))

    def _device(self, record: StageRecord) -> str:
        mapper = self.mappers.get(record.mapper)
        device = mapper.find(record) if mapper is not None else None
        if device is None:
            raise FailedPrecondition(
                f"volume {record.volume_id} is staged at {record.staging_path}, but its {record.mapper} device is gone "
                "(e.g. rbd-fuse died with a restarted plugin); stop the pods using it so it is unstaged, then stage it again"
            )
        return device

    def sync_device(self, record: StageRecord, device: str, required: int) -> int:
        """Make `device` show the image's current size (at least `required` bytes); its size."""
        if record.mapper == FUSE:
            return self._sync_loop(record, device, required)
        if record.mapper == NBD and self.netlink_bound(device):
            return self._sync_netlink_nbd(record, device, required)
        return self._wait_for(f"{record.mapper} device {device}", lambda: self.size_of(device), required,
                              "the kernel (krbd) or rbd-nbd has not picked up the new size")

    def sync_mapping(self, record: StageRecord, device: str) -> str:
        """The device the filesystem is on: for an encrypted volume its LUKS mapping, grown to the
        mapped device's size first (`cryptsetup resize`: dm-crypt never follows its backing device
        by itself); else `device` itself."""
        if not record.crypt_name:
            return device
        active = self.cryptsetup.status(record.crypt_name)
        if active is None:
            raise FailedPrecondition(
                f"the LUKS mapping {record.crypt_name} of volume {record.volume_id} is not open; stop the pods "
                "using the volume so it is unstaged, then stage it again"
            )
        wanted = self.size_of(device) - active.offset * 512
        if active.sectors * 512 < wanted:
            grown = self.cryptsetup.resize(record.crypt_name)
            log.info("LUKS mapping grown", extra=fields(volume_id=record.volume_id, mapping=record.crypt_name,
                                                         bytes=grown))
        return record.data_device

    def _sync_netlink_nbd(self, record: StageRecord, device: str, required: int) -> int:
        deadline = time.monotonic() + min(self.wait_seconds, _NETLINK_GRACE)
        size = self.size_of(device)
        while size < required and time.monotonic() < deadline:
            self.sleep(_POLL)
            size = self.size_of(device)
        if size < required:
            raise FailedPrecondition(nbd.resize_blocked(record.volume_id, device, size, required))
        return size

    def _sync_loop(self, record: StageRecord, device: str, required: int) -> int:
        backing = backing_file(record.work_dir, record.image)

        def image_bytes() -> int:
            try:
                return os.stat(backing).st_size
            except OSError as error:
                raise Unavailable(
                    f"cannot read the size of {backing} from rbd-fuse ({error.strerror}); is its rbd-fuse alive?"
                ) from None

        wanted = self._wait_for(f"rbd-fuse file {backing}", image_bytes, required, "rbd-fuse still reports the old size")
        if self.size_of(device) < wanted:
            self.run(["losetup", "--set-capacity", device], what=f"resize loop device {device} of volume {record.volume_id}",
                     timeout=self.timeout)
        size = self.size_of(device)
        if size < wanted:
            raise Internal(f"loop device {device} still has {size} bytes after losetup --set-capacity, not {wanted}")
        return size

    def _wait_for(self, what: str, current: Callable[[], int], required: int, hint: str) -> int:
        """Poll `current()` until it reaches `required` (image watchers update asynchronously)."""
        deadline = time.monotonic() + self.wait_seconds
        size = current()
        while size < required and time.monotonic() < deadline:
            self.sleep(_POLL)
            size = current()
        if size < required:
            raise FailedPrecondition(
                f"{what} has {size} bytes, fewer than the {required} requested: the image was not grown yet "
                f"(ControllerExpandVolume must run first) or {hint}; retry"
            )
        return size

    def grow_filesystem(self, record: StageRecord, device: str) -> None:
        if record.access_type != ACCESS_MOUNT:
            return
        if record.read_only:
            log.info("read-only stage: filesystem not grown", extra=fields(volume_id=record.volume_id))
            return
        size = self.fs_size(device, record.fs_type)
        if size is None:
            found = filesystems.probe(self.run, device, self.timeout)
            raise FailedPrecondition(
                f"volume {record.volume_id} (device {device}) holds {found.fs_type or found.other or 'no filesystem'}, "
                f"not the {record.fs_type} it was staged with; refusing to resize it"
            )
        device_bytes = self.size_of(device)
        if size.fills(device_bytes):
            return
        self._require_mounted(record, device)
        if record.fs_type == "ext4":
            argv = ["resize2fs", device]
        else:
            argv = ["xfs_growfs", "-d", record.mount_path]
        what = f"grow the {record.fs_type} filesystem of volume {record.volume_id}"
        try:
            self.run(argv, what=what, timeout=self.timeout)
        except CommandFailed as error:
            if "permission denied" in error.stderr.lower():
                # EXT4_IOC_RESIZE_FS requires CAP_SYS_RESOURCE, XFS_IOC_FSGROWFS CAP_SYS_ADMIN.
                raise FailedPrecondition(
                    f"{what}: the kernel refused ({tail(error.stderr, 200)}); the node plugin needs CAP_SYS_RESOURCE "
                    "(ext4) and CAP_SYS_ADMIN (xfs) to grow a mounted filesystem: run it privileged"
                ) from None
            raise
        log.info("filesystem grown", extra=fields(volume_id=record.volume_id, fs_type=record.fs_type,
                                                  before=size.bytes, device_bytes=device_bytes))

    def _require_mounted(self, record: StageRecord, device: str) -> None:
        """Both tools grow a mounted filesystem only (resize2fs wants a fresh fsck otherwise)."""
        entry = mounts.top_mount(record.mount_path, self.read_mounts())
        try:
            ours = entry is not None and entry.device_numbers == self.device_numbers(device)
        except OSError:
            ours = False
        if not ours:
            raise FailedPrecondition(
                f"volume {record.volume_id} is not mounted at {record.mount_path} from {device}; stage it again "
                "(the filesystem is grown when it is staged)"
            )
