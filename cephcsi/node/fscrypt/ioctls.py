"""The kernel's fscrypt ioctls (linux/fscrypt.h), v2 policies and the filesystem keyring only.

Each call opens the directory (or the mount point) read-only and issues fcntl.ioctl with the
struct packed by hand; the layouts are the kernel UAPI's and do not change.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

from cephcsi.errors import FailedPrecondition

# _IOR/_IOWR('f', nr, size): dir << 30 | size << 16 | 'f' << 8 | nr
FS_IOC_SET_ENCRYPTION_POLICY = 0x800C6613
FS_IOC_GET_ENCRYPTION_POLICY_EX = 0xC0096616
FS_IOC_ADD_ENCRYPTION_KEY = 0xC0506617
FS_IOC_REMOVE_ENCRYPTION_KEY = 0xC0406618
FS_IOC_GET_ENCRYPTION_KEY_STATUS = 0xC080661A

KEY_SPEC_TYPE_IDENTIFIER = 2
POLICY_V2 = 2
PAD_FLAGS = {4: 0, 8: 1, 16: 2, 32: 3}
KEY_STATUS_PRESENT = 2

_POLICY_V2 = struct.Struct("=BBBBB3x16s")          # version, contents, filenames, flags, log2 data unit
_KEY_SPEC = struct.Struct("=II32s")                # type, reserved, identifier (16) in a 32-byte union
_ADD_KEY = struct.Struct("=40sII32x")              # key_spec, raw_size, key_id, reserved[8]
_REMOVE_KEY = struct.Struct("=40sI20x")            # key_spec, removal_status_flags, reserved[5]
_KEY_STATUS = struct.Struct("=40s24xIII52x")       # key_spec, reserved[6], status, flags, user_count


@dataclass(frozen=True)
class KernelPolicy:
    contents: int
    filenames: int
    padding: int
    identifier: str
    """hex, the same as google/fscrypt's v2 policy descriptor"""


class NotSupported(FailedPrecondition):
    pass


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _key_spec(identifier: str) -> bytes:
    return _KEY_SPEC.pack(KEY_SPEC_TYPE_IDENTIFIER, 0, bytes.fromhex(identifier))


def get_policy(directory: str) -> KernelPolicy | None:
    """The directory's policy, or None when it has none."""
    fd = _open(directory)
    try:
        buf = bytearray(struct.pack("=Q", 24) + bytes(24))
        try:
            fcntl.ioctl(fd, FS_IOC_GET_ENCRYPTION_POLICY_EX, buf)
        except OSError as e:
            if e.errno in (errno.ENODATA, errno.ENOENT):
                return None
            if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY):
                raise NotSupported(f"the filesystem of {directory} does not support encryption "
                                   "(ext4 needs the encrypt feature)") from e
            raise
    finally:
        os.close(fd)
    version = buf[8]
    if version != POLICY_V2:
        raise FailedPrecondition(f"{directory} has an fscrypt policy of version {version}; only v2 is supported")
    _, contents, filenames, flags, _, ident = _POLICY_V2.unpack_from(buf, 8)
    padding = {v: k for k, v in PAD_FLAGS.items()}[flags & 3]
    return KernelPolicy(contents, filenames, padding, ident.hex())


def set_policy(directory: str, policy: KernelPolicy) -> None:
    """Set a v2 policy on an empty directory; setting the same policy again succeeds (kernel)."""
    fd = _open(directory)
    try:
        arg = _POLICY_V2.pack(POLICY_V2, policy.contents, policy.filenames, PAD_FLAGS[policy.padding], 0,
                              bytes.fromhex(policy.identifier))
        fcntl.ioctl(fd, FS_IOC_SET_ENCRYPTION_POLICY, arg)
    except OSError as e:
        if e.errno == errno.EEXIST:
            raise FailedPrecondition(f"{directory} already has another fscrypt policy") from e
        if e.errno == errno.ENOTEMPTY:
            raise FailedPrecondition(f"{directory} is not empty and has no fscrypt policy: "
                                     "its files were written unencrypted; refusing to encrypt over them") from e
        if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY):
            raise NotSupported(f"the filesystem of {directory} does not support encryption") from e
        raise
    finally:
        os.close(fd)


def add_key(mount_point: str, key: bytes) -> str:
    """Add a v2 policy key to the filesystem keyring; returns its identifier (hex). Adding a key
    that is present again succeeds (the kernel counts the adder)."""
    fd = _open(mount_point)
    try:
        arg = bytearray(_ADD_KEY.pack(_KEY_SPEC.pack(KEY_SPEC_TYPE_IDENTIFIER, 0, bytes(32)), len(key), 0) + key)
        try:
            fcntl.ioctl(fd, FS_IOC_ADD_ENCRYPTION_KEY, arg)
        finally:
            # The raw key stays in this buffer only as long as needed.
            key_at = _ADD_KEY.size
            arg[key_at:] = bytes(len(key))
    finally:
        os.close(fd)
    _, _, identifier = _KEY_SPEC.unpack_from(arg, 0)
    return bytes(identifier[:16]).hex()


def key_present(mount_point: str, identifier: str) -> bool:
    fd = _open(mount_point)
    try:
        buf = bytearray(_KEY_STATUS.pack(_key_spec(identifier), 0, 0, 0))
        fcntl.ioctl(fd, FS_IOC_GET_ENCRYPTION_KEY_STATUS, buf)
    finally:
        os.close(fd)
    return bool(_KEY_STATUS.unpack_from(buf)[1] == KEY_STATUS_PRESENT)


def remove_key(mount_point: str, identifier: str) -> None:
    """Remove the key (files still open keep it busy: the kernel then removes it when they close).
    A key that is absent is success."""
    fd = _open(mount_point)
    try:
        fcntl.ioctl(fd, FS_IOC_REMOVE_ENCRYPTION_KEY, bytearray(_REMOVE_KEY.pack(_key_spec(identifier), 0)))
    except OSError as e:
        if e.errno != errno.ENOKEY:
            raise
    finally:
        os.close(fd)
