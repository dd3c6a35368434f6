"""Probe, create and mount filesystems on mapped devices — without ever reformatting.

The rule that protects users' data: mkfs runs only when a low-level probe (`blkid -p`, which
reads the device itself, bypassing blkid's cache) finds no signature at all. blkid reports an
unreadable device exactly like an empty one (exit 2), so the device is first read directly;
an I/O error there stops the stage instead of formatting. A filesystem other than the one
requested, a partition table, or anything else blkid recognises is FAILED_PRECONDITION and the
device is left untouched. (mke2fs itself would happily overwrite an ext4 when not on a tty.)

mkfs defaults are ceph-csi's: ext4 `-m0 -Enodiscard,lazy_itable_init=1,lazy_journal_init=1`
(no reserved blocks; no discard of a thin image; inode tables and journal initialised lazily,
so formatting a large image does not write all of it), xfs `-K` (no discard). A `mkfsOptions`
StorageClass parameter replaces the defaults. XFS is mounted with `nouuid`: clones and restored
snapshots share their parent's UUID and XFS refuses a second mount with the same UUID.
"""
from __future__ import annotations

import logging
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cephcsi.errors import FailedPrecondition, Internal, InvalidArgument
from cephcsi.node import devices
from cephcsi.node.exec import Runner
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DEFAULT_MKFS_OPTIONS = {
    "ext4": ["-m0", "-Enodiscard,lazy_itable_init=1,lazy_journal_init=1"],
    "xfs": ["-K"],
}
FS_MOUNT_OPTIONS = {"ext4": [], "xfs": ["nouuid"]}
# Always on: the volume sits on network storage, so shutdown must unmount it before the
# network goes (systemd reads this from utab for mounts it did not create).
COMMON_MOUNT_OPTIONS = ["_netdev"]


@dataclass(frozen=True)
class Probe:
    fs_type: str
    """Filesystem type found ('' when none)."""
    other: str
    """Any other signature found (partition table, RAID member...), '' when none."""

    @property
    def empty(self) -> bool:
        return not self.fs_type and not self.other


def parse_blkid_export(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def probe(runner: Runner, device: str, timeout: float) -> Probe:
    devices.read_probe(device)
    # Exit 2: nothing found. Other non-zero codes (e.g. 8, ambivalent result: several
    # signatures) mean something is there, which we must not format over.
    result = runner(
        ["blkid", "-p", "-o", "export", device], what=f"probe {device} for a filesystem", timeout=timeout, ok_codes=(0, 2, 8)
    )
    if result.returncode == 2:
        if result.stderr.strip():
            raise Internal(f"probing {device} failed: {result.stderr.strip()[:300]}")
        return Probe("", "")
    if result.returncode == 8:
        return Probe("", "several conflicting signatures (blkid: ambivalent result)")
    values = parse_blkid_export(result.stdout)
    usage = values.get("USAGE", "")
    fs_type = values.get("TYPE", "")
    if fs_type and usage in ("", "filesystem"):
        return Probe(fs_type, "")
    if values.get("PTTYPE"):
        return Probe("", f"a {values['PTTYPE']} partition table")
    return Probe("", f"{fs_type or 'unknown'} data ({usage or 'unknown usage'})")


def mkfs_argv(fs_type: str, device: str, mkfs_options: str) -> list[str]:
    if fs_type not in DEFAULT_MKFS_OPTIONS:
        raise InvalidArgument(f"cannot create filesystem {fs_type!r} (supported: {', '.join(DEFAULT_MKFS_OPTIONS)})")
    if mkfs_options.strip():
        try:
            options = shlex.split(mkfs_options)
        except ValueError as error:
            raise InvalidArgument(f"mkfsOptions {mkfs_options!r} cannot be parsed: {error}") from None
    else:
        options = list(DEFAULT_MKFS_OPTIONS[fs_type])
    return [f"mkfs.{fs_type}", *options, device]


def ensure_filesystem(
    runner: Runner,
    device: str,
    fs_type: str,
    mkfs_options: str,
    timeout: float,
    on_mkfs_start: Callable[[], None] | None = None,
    resume_mkfs: bool = False,
) -> bool:
    """Make sure `device` holds an `fs_type` filesystem; returns True when we created it.

    `on_mkfs_start` runs after the probe found the device empty and before mkfs (the caller
    records that, so a crash mid-mkfs can be resumed). `resume_mkfs` is set when such a record
    exists: the device was empty before our interrupted mkfs, so a partial signature of that
    same filesystem type may be overwritten.
    """
    found = probe(runner, device, timeout)
    if found.fs_type == fs_type and not resume_mkfs:
        return False
    if not found.empty and not (resume_mkfs and found.fs_type in ("", fs_type)):
        if found.fs_type:
            raise FailedPrecondition(
                f"device {device} already holds a {found.fs_type} filesystem, not the requested {fs_type}; "
                f"refusing to format it (its data is left untouched). Request fsType {found.fs_type} to use it"
            )
        raise FailedPrecondition(f"device {device} already holds {found.other}; refusing to format it (its data is left untouched)")
    if on_mkfs_start is not None:
        on_mkfs_start()
    argv = mkfs_argv(fs_type, device, mkfs_options)
    if resume_mkfs and not found.empty:
        argv.insert(1, "-F" if fs_type == "ext4" else "-f")
    runner(argv, what=f"create {fs_type} filesystem on {device}", timeout=timeout)
    log.info("filesystem created", extra=fields(device=device, fs_type=fs_type, argv=" ".join(argv)))
    return True


def mount_options(fs_type: str, flags: Sequence[str], read_only: bool) -> list[str]:
    options: list[str] = []
    for option in [*COMMON_MOUNT_OPTIONS, *FS_MOUNT_OPTIONS.get(fs_type, []), *flags, *(["ro"] if read_only else [])]:
        if option not in options:
            options.append(option)
    return options
