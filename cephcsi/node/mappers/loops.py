"""Loop devices, as the kernel describes them: which file backs each one (sysfs), the identity
LOOP_GET_STATUS64 reports, and whether a device a stage recorded is still that attachment.

Read straight from sysfs and the ioctl rather than by parsing `losetup` output: these run on
every unstage and every capacity sweep, and the kernel's own answer needs no exec."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct

from cephcsi.node.stage_record import LoopBacking
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

SYS_BLOCK = "/sys/block"
_LOOP_GET_STATUS64 = 0x4C05  # linux/loop.h
# struct loop_info64: lo_device, lo_inode, lo_rdevice, lo_offset, lo_sizelimit (u64); lo_number,
# lo_encrypt_type, lo_encrypt_key_size, lo_flags (u32); lo_file_name[64]; ... 232 bytes in all.
_LOOP_INFO64 = struct.Struct("=QQQQQIIII64s")
_LOOP_INFO64_SIZE = 232


def loops_backed_by(path: str, sys_block: str | None = None) -> list[str]:
    """Loop devices whose backing file is `path` (what `losetup -j` reports, read from sysfs)."""
    return [device for device, backing in attached_loops(sys_block) if backing == path]


def loops_under(directory: str, sys_block: str | None = None) -> list[tuple[str, str]]:
    """(device, backing file) of loop devices backed by a file under `directory`."""
    prefix = directory.rstrip("/") + "/"
    return [(device, backing) for device, backing in attached_loops(sys_block) if backing.startswith(prefix)]


def attached_loops(sys_block: str | None = None) -> list[tuple[str, str]]:
    """(device, backing file) for every attached loop device, from sysfs."""
    sys_block = sys_block or SYS_BLOCK
    found: list[tuple[str, str]] = []
    try:
        names = sorted(os.listdir(sys_block))
    except OSError:
        return found
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(os.path.join(sys_block, name, "loop", "backing_file"), encoding="utf-8", errors="replace") as fh:
                backing = fh.read().rstrip("\n")
        except OSError:
            continue  # not attached
        found.append((f"/dev/{name}", backing.removesuffix(" (deleted)")))
    return found


def loop_status(device: str) -> LoopBacking | None:
    """What LOOP_GET_STATUS64 says `device` is attached to; None when it is not an attached loop
    device (ENXIO), cannot be opened, or its backing file cannot be stat'ed (the kernel stats it
    for this call: a FUSE mount whose daemon died answers ENOTCONN)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        buffer = fcntl.ioctl(fd, _LOOP_GET_STATUS64, bytes(_LOOP_INFO64_SIZE))
    except OSError as error:
        if error.errno != errno.ENXIO:
            log.debug("cannot read loop device status", extra=fields(device=device, error=error.strerror))
        return None
    finally:
        os.close(fd)
    backing_dev, inode, *_, raw_name = _LOOP_INFO64.unpack_from(buffer)
    name = raw_name.split(b"\0", 1)[0].decode("utf-8", "replace")
    return LoopBacking(device, loop_diskseq(device), name, os.major(backing_dev), os.minor(backing_dev), inode)


def loop_diskseq(device: str) -> int:
    """The loop device's disk sequence number (0 when the kernel has none)."""
    try:
        with open(os.path.join(SYS_BLOCK, os.path.basename(device), "diskseq"), encoding="ascii") as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def recorded_loop_state(recorded: LoopBacking, backing: str | None, image: str) -> str:
    """Whether the loop device a stage recorded is still that attachment: 'gone' (not attached),
    'ours', 'other' (the name now serves another file), or 'unknown' (no diskseq on this kernel
    and the backing file cannot be stat'ed)."""
    if backing is None:
        return "gone"
    if os.path.basename(backing) != image:
        return "other"
    current = loop_diskseq(recorded.device)
    if recorded.diskseq and current:
        return "ours" if current == recorded.diskseq else "other"
    status = loop_status(recorded.device)
    if status is None:
        return "unknown"
    same = (status.file_name, status.backing_major, status.backing_minor, status.backing_inode) == (
        recorded.file_name, recorded.backing_major, recorded.backing_minor, recorded.backing_inode
    )
    return "ours" if same else "other"
