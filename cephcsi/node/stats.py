"""Usage and health of a staged or published volume, for NodeGetVolumeStats.

Usage: statvfs for filesystems (bytes and inodes), the device size (BLKGETSIZE64) for block
volumes. Health ("volume condition") is abnormal, with a message an operator can act on, when:
  * the path cannot be accessed (ENOTCONN/EIO: the mapping behind it failed);
  * the block device behind the mount is gone (unmapped underneath us);
  * a loop device's backing file is unreachable (the rbd-fuse daemon died);
  * the filesystem went read-only on its own (ext4 errors=remount-ro after I/O errors).
"""
from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace

from cephcsi.node import devices, mounts
from cephcsi.node.mappers.fuse import fuse_processes
from cephcsi.node.mounts import MountEntry


@dataclass(frozen=True)
class VolumeStats:
    block: bool
    total_bytes: int | None = None
    used_bytes: int | None = None
    available_bytes: int | None = None
    total_inodes: int | None = None
    used_inodes: int | None = None
    available_inodes: int | None = None
    abnormal: bool = False
    message: str = "volume is healthy"


def abnormal(message: str, block: bool = False) -> VolumeStats:
    return VolumeStats(block=block, abnormal=True, message=message)


def filesystem_usage(path: str) -> VolumeStats:
    st = os.statvfs(path)
    return VolumeStats(
        block=False,
        total_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
        total_inodes=st.f_files,
        used_inodes=st.f_files - st.f_ffree,
        available_inodes=st.f_favail,
    )


def device_problem(major: int, minor: int, backing_ok: Callable[[str], str | None]) -> str | None:
    """Why the block device major:minor is unusable, or None when it looks fine."""
    sys_dir = f"/sys/dev/block/{major}:{minor}"
    if not os.path.exists(sys_dir):
        return f"block device {major}:{minor} behind the volume no longer exists (unmapped?)"
    backing_path = os.path.join(sys_dir, "loop", "backing_file")
    if os.path.basename(os.path.realpath(sys_dir)).startswith("loop"):
        try:
            with open(backing_path, encoding="utf-8", errors="replace") as fh:
                backing = fh.read().rstrip("\n").removesuffix(" (deleted)")
        except OSError:
            return f"loop device {major}:{minor} behind the volume is detached"
        problem = backing_ok(backing)
        if problem:
            return problem
    return None


class BackingCheck:
    """Callable: is a loop device's backing file served? For a file on an rbd-fuse mount the
    daemon must be alive — a stat alone can be answered from the kernel's attribute cache for a
    while after the daemon died — and the file must answer a stat within a bound."""

    def __init__(self, probe_timeout: float = 5.0) -> None:
        self.probe_timeout = probe_timeout

    def __call__(self, backing: str) -> str | None:
        fuse_mount = _fuse_mount_of(backing)
        if fuse_mount is not None and not fuse_processes(fuse_mount):
            return (
                f"the userspace mapper (rbd-fuse) serving {fuse_mount} is not running, so the loop device behind "
                "the volume fails all I/O; unstage and stage the volume again"
            )
        try:
            state = mounts.probe_path(backing, self.probe_timeout)
        except Exception as error:  # noqa: BLE001 - a health probe reports, never raises
            return f"backing file {backing} does not answer ({error})"
        if state == "ok":
            return None
        return (
            f"backing file {backing} of the loop device is {state}: the userspace mapper (rbd-fuse) is not "
            "running; unstage and stage the volume again"
        )


def _fuse_mount_of(path: str) -> str | None:
    """The rbd-fuse mount point holding `path`, if it lies on one."""
    best: MountEntry | None = None
    for entry in mounts.read_mounts():
        if path.startswith(entry.mount_point.rstrip("/") + "/") and (
            best is None or len(entry.mount_point) > len(best.mount_point)
        ):
            best = entry
    if best is not None and best.fs_type == "fuse.rbd-fuse":
        return best.mount_point
    return None


def volume_stats(path: str, entry: MountEntry, backing_ok: Callable[[str], str | None]) -> VolumeStats:
    """Stats of the volume mounted at `path` (`entry` is its mount table line)."""
    state = mounts.path_state(path)
    if state != "ok":
        return abnormal(f"{path} is not accessible ({state}): the device or mapping behind it failed")
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        return abnormal(f"{path} is not accessible: {error.strerror}")
    if stat.S_ISBLK(mode):
        major, minor = devices.device_numbers(path)
        problem = device_problem(major, minor, backing_ok)
        if problem:
            return abnormal(problem, block=True)
        try:
            size = devices.size_bytes(path)
        except OSError as error:
            return abnormal(f"cannot read the size of block volume {path}: {error.strerror}", block=True)
        return VolumeStats(block=True, total_bytes=size)
    problem = device_problem(entry.major, entry.minor, backing_ok)
    if problem:
        return abnormal(problem)
    try:
        usage = filesystem_usage(path)
    except OSError as error:
        return abnormal(f"statfs on {path} failed: {error.strerror}")
    if "ro" in entry.super_options and "rw" in entry.options:
        return replace(
            usage,
            abnormal=True,
            message=(
                f"the filesystem at {path} was mounted read-write but is now read-only (the kernel does that "
                "after I/O errors); check the node's kernel log"
            ),
        )
    return usage
