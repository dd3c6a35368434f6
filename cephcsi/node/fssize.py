"""How big the filesystem on a device is, read from its ext4 or XFS superblock (no process started).

Used to skip resize2fs/xfs_growfs when the filesystem already fills its device; a stale answer
only makes the caller run the grow tool for nothing. Superblock layouts: docs/design/node.md.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

_EXT4_OFFSET = 1024
_EXT4_MAGIC = 0xEF53
_EXT4_INCOMPAT_64BIT = 0x80
_READ = 4096


@dataclass(frozen=True)
class FsSize:
    fs_type: str
    block_size: int
    blocks: int

    @property
    def bytes(self) -> int:
        return self.block_size * self.blocks

    def fills(self, device_bytes: int) -> bool:
        """True when not even one more block fits on the device: nothing to grow."""
        return device_bytes - self.bytes < self.block_size


def parse_ext4(data: bytes) -> FsSize | None:
    sb = data[_EXT4_OFFSET : _EXT4_OFFSET + 1024]
    if len(sb) < 340 or struct.unpack_from("<H", sb, 56)[0] != _EXT4_MAGIC:
        return None
    blocks = struct.unpack_from("<I", sb, 4)[0]
    log_block = struct.unpack_from("<I", sb, 24)[0]
    if log_block > 6:  # 64 KiB is the largest ext4 block size: anything else is not a superblock
        return None
    if struct.unpack_from("<I", sb, 96)[0] & _EXT4_INCOMPAT_64BIT:
        blocks |= struct.unpack_from("<I", sb, 336)[0] << 32
    return FsSize("ext4", 1024 << log_block, blocks)


def parse_xfs(data: bytes) -> FsSize | None:
    if len(data) < 16 or data[:4] != b"XFSB":
        return None
    block_size, blocks = struct.unpack_from(">IQ", data, 4)
    if block_size < 512 or block_size & (block_size - 1):
        return None
    return FsSize("xfs", block_size, blocks)


PARSERS = {"ext4": parse_ext4, "xfs": parse_xfs}


def read_head(path: str) -> bytes:
    """The first 4 KiB of a device, bypassing the page cache where possible (a mounted XFS
    writes its superblock around the block device's cache, so a cached copy can be old)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        fd = -1
    if fd >= 0:
        try:
            buffer = mmap.mmap(-1, _READ)  # page-aligned, as O_DIRECT requires
            try:
                count = os.preadv(fd, [buffer], 0)
                return bytes(buffer[:count])
            except OSError:
                pass  # e.g. EINVAL: this file does not support direct I/O; read it normally
            finally:
                buffer.close()
        finally:
            os.close(fd)
    with open(path, "rb") as handle:
        return handle.read(_READ)


def filesystem_size(path: str, fs_type: str) -> FsSize | None:
    """The size of the `fs_type` filesystem on the device, None when its superblock is not one."""
    parser = PARSERS.get(fs_type)
    return parser(read_head(path)) if parser is not None else None
