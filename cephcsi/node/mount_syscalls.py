"""mount(2) and umount2(2) for the two operations the node repeats most: bind and unmount.

Why by hand: NodePublish is one bind mount and NodeUnpublish one unmount, and exec'ing
mount(8)/umount(8) costs about 3 ms each (fork, exec, libmount start-up): more than the rest
of the call. No maintained Python library wraps these syscalls; ctypes on the C library is the
standard route. Only per-mount VFS flags are handled here (what a bind mount can carry);
anything else a CO passes in mount_flags goes to mount(8) as before (`supported`).
"""
from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_RELATIME = 0x200000
MS_STRICTATIME = 0x1000000

# Flag names as mount(8) and /proc/self/mountinfo's per-mount field spell them.
FLAGS: dict[str, int] = {
    "ro": MS_RDONLY, "rw": 0, "nosuid": MS_NOSUID, "suid": 0, "nodev": MS_NODEV, "dev": 0,
    "noexec": MS_NOEXEC, "exec": 0, "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME,
}
# Per-mount flags a read-only remount must carry over: MS_REMOUNT|MS_BIND sets the mount's flags
# to exactly those given (atime flags excepted, which the kernel preserves), so leaving one out
# would clear it (and fail with EPERM where the flag is locked). mount(8) does the same merge.
_KEPT_ON_REMOUNT = MS_NOSUID | MS_NODEV | MS_NOEXEC

# The running interpreter already links the C library: no search for libc.so by name.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def supported(options: Iterable[str]) -> bool:
    """True when every option is a per-mount VFS flag this module can apply."""
    return all(option in FLAGS or option in ("bind", "remount") for option in options)


def flags_of(options: Iterable[str]) -> int:
    value = 0
    for option in options:
        value |= FLAGS.get(option, 0)
    return value


def _check(result: int) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def bind(source: str, target: str) -> None:
    """mount --bind source target."""
    _check(_libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND, None))


def remount_bind(target: str, options: Iterable[str], current: Iterable[str]) -> None:
    """mount -o remount,bind,<options> target, keeping the nosuid/nodev/noexec it has now
    (`current`: its per-mount options from mountinfo)."""
    flags = MS_REMOUNT | MS_BIND | flags_of(options) | (flags_of(current) & _KEPT_ON_REMOUNT)
    _check(_libc.mount(None, os.fsencode(target), None, flags, None))


def unmount(target: str) -> bool:
    """umount target; False when it was not a mount point (EINVAL) or is gone (ENOENT)."""
    try:
        _check(_libc.umount2(os.fsencode(target), 0))
    except OSError as error:
        if error.errno in (errno.EINVAL, errno.ENOENT):
            return False
        raise
    return True
