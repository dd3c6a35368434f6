"""The staging mount of a volume: its filesystem mounted (or its device bound) at the stage
record's mount path, whether what is mounted there is a given device, and which publishes under
the kubelet directory still share it. The mount table and device numbers decide; a mount of
another device in the way is FAILED_PRECONDITION. Writes no record (the stager does)."""
from __future__ import annotations

import os
from collections.abc import Callable

from cephcsi.errors import FailedPrecondition, Internal
from cephcsi.node import devices, filesystems, mounts
from cephcsi.node.stage_paths import make_bind_file, make_mount_dir
from cephcsi.node.stage_record import ACCESS_BLOCK, StageRecord


class StagingMounts:
    def __init__(self, mounter: mounts.Mounter, read_mounts: Callable[[], list[mounts.MountEntry]],
                 kubelet_dir: str, before_mount: Callable[[StageRecord], None] | None = None) -> None:
        self.mounter = mounter
        self.read_mounts = read_mounts
        self.kubelet_dir = kubelet_dir
        self.before_mount = before_mount

    def ensure_fs_mount(self, record: StageRecord, created: list[str]) -> None:
        target = record.mount_path
        entry = mounts.top_mount(target, self.read_mounts())
        major, minor = device_numbers(record.data_device)
        if entry is not None:
            if (entry.major, entry.minor) != (major, minor):
                raise FailedPrecondition(
                    f"{target} has a mount of another device ({entry.source}); unmount it by hand, then retry"
                )
            return
        make_mount_dir(target)
        if self.before_mount is not None:
            self.before_mount(record)  # unmounted here, and mounted nowhere else (our stage)
        options = filesystems.mount_options(record.fs_type, record.mount_flags, record.read_only)
        self.mounter.mount(record.data_device, target, record.fs_type, options)
        created.append("mount")

    def ensure_block_bind(self, record: StageRecord, created: list[str]) -> None:
        target = record.mount_path
        if mounts.is_mount_point(target, self.read_mounts()):
            if rdev(target) != rdev(record.data_device):
                raise FailedPrecondition(f"{target} has another device bound to it; unmount it by hand, then retry")
            return
        make_bind_file(target)
        self.mounter.bind(record.data_device, target, read_only=record.read_only)
        created.append("mount")

    def mounted_from(self, device: str, record: StageRecord) -> str:
        """The record's mount path when the top mount there is `device`, else ''."""
        entry = mounts.top_mount(record.mount_path, self.read_mounts())
        if entry is None:
            return ""
        if record.access_type == ACCESS_BLOCK:
            return record.mount_path if rdev(record.mount_path) == rdev(device) and rdev(device) is not None else ""
        try:
            return record.mount_path if (entry.major, entry.minor) == devices.device_numbers(device) else ""
        except OSError:
            return ""

    def publications(self, anchor: mounts.MountEntry, table: list[mounts.MountEntry]) -> list[str]:
        others = mounts.mounts_sharing(anchor, table)
        if self.kubelet_dir:
            # Only mounts of our namespace under the kubelet dir are publishes; a propagated copy
            # of the staging mount elsewhere (host bind of the kubelet dir) is not.
            root = os.path.realpath(self.kubelet_dir).rstrip("/") + "/"
            others = [e for e in others if e.mount_point.startswith(root)]
        staging_root = os.path.realpath(os.path.dirname(anchor.mount_point)).rstrip("/") + "/"
        return [e.mount_point for e in others if not e.mount_point.startswith(staging_root)]


def device_numbers(device: str) -> tuple[int, int]:
    try:
        return devices.device_numbers(device)
    except OSError as error:
        raise Internal(f"mapped device {device} disappeared before it could be mounted ({error.strerror}); retry") from None


def rdev(path: str) -> int | None:
    try:
        return os.stat(path).st_rdev
    except OSError:
        return None
