"""Block device nodes: waiting for them to appear, and facts about them.

Where udev runs (/run/udev/control exists) the wait listens for the udev "add" event with
pyudev, so a mapping is usable as soon as udev has created the node and its links. Without
udev (containers without /run/udev, or this test machine) device nodes come from devtmpfs and
we poll for them with a bounded, short interval.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import struct
import time

from cephcsi.errors import DeadlineExceeded, Internal, OperationInFlight
from cephcsi.node import mounts
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

UDEV_CONTROL = "/run/udev/control"
_BLKGETSIZE64 = 0x80081272  # _IOR(0x12, 114, size_t) from linux/fs.h
_POLL_SECONDS = 0.05


def udev_running() -> bool:
    return os.path.exists(UDEV_CONTROL)


def is_block_device(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def device_numbers(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def size_bytes(path: str) -> int:
    """Size of a block device (BLKGETSIZE64), or of a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if not stat.S_ISBLK(os.fstat(fd).st_mode):
            return os.fstat(fd).st_size
        buffer = fcntl.ioctl(fd, _BLKGETSIZE64, b"\0" * 8)
        return int(struct.unpack("Q", buffer)[0])
    finally:
        os.close(fd)


def wait_for_device(path: str, timeout: float) -> None:
    """Return once `path` is a block device; DEADLINE_EXCEEDED after `timeout` seconds."""
    if is_block_device(path):
        return
    started = time.monotonic()
    if udev_running():
        _wait_udev(path, timeout)
    else:
        _wait_poll(path, timeout)
    log.debug("device ready", extra=fields(device=path, ms=round((time.monotonic() - started) * 1000, 1)))


def _wait_poll(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not is_block_device(path):
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"device {path} did not appear within {timeout:g}s")
        time.sleep(_POLL_SECONDS)


def _wait_udev(path: str, timeout: float) -> None:
    try:
        import pyudev
    except ImportError:  # pragma: no cover - pyudev is a dependency; degrade rather than fail
        _wait_poll(path, timeout)
        return
    try:
        context = pyudev.Context()
        monitor = pyudev.Monitor.from_netlink(context)
        monitor.filter_by("block")
        monitor.start()
    except (OSError, ValueError) as error:
        log.warning("udev monitor unavailable, polling", extra=fields(device=path, error=str(error)))
        _wait_poll(path, timeout)
        return
    deadline = time.monotonic() + timeout
    # Check after the monitor started: an event that came before is not lost that way.
    while not is_block_device(path):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"device {path} did not appear within {timeout:g}s (udev gave no add event)")
        # Short poll slices: the node can also appear without an event reaching us (devtmpfs).
        monitor.poll(timeout=min(remaining, 0.5))


def read_probe(path: str, length: int = 64 * 1024) -> None:
    """Read the start of a device, so that 'nothing found' from blkid can be trusted to mean
    an empty device and not an unreadable one (blkid reports both the same way)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise Internal(f"cannot open device {path} to probe it: {error.strerror}") from None
    try:
        os.read(fd, length)
    except OSError as error:
        raise Internal(f"cannot read device {path} (I/O to the image fails): {error.strerror}") from None
    finally:
        os.close(fd)


def require_unclaimed(path: str) -> None:
    """ABORTED while something else holds the device claimed; call before a format or a mount.

    Opening a block device with O_EXCL claims it, as mount, mkfs and an offline resize2fs do,
    and fails with EBUSY while another holder has it. The holder that matters is one of ours
    that a killed plugin left running (the plugin runs with hostPID, so its children outlive
    it): an mkfs, which blkid cannot see until it writes its superblock at the end, or an
    offline resize2fs. Formatting or mounting under either would corrupt what it writes; the
    kubelet retries once it is done. The message names the holder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_EXCL)
    except OSError as error:
        if error.errno != errno.EBUSY:
            raise Internal(f"cannot open device {path}: {error.strerror}") from None
        if _mounted(path):
            # The claim is a mount of this very device: another staging of the same image,
            # which krbd maps once per node. Mounting it again shares that filesystem, as it
            # always did; only a claim without a mount is one of the commands above.
            return
        holders = ", ".join(openers(path)) or "another block device or a mount this plugin cannot see"
        raise OperationInFlight(
            f"device {path} is claimed by {holders}; it is neither probed nor formatted nor mounted while "
            "claimed (an mkfs or resize2fs interrupted by a plugin restart finishes on its own): retry"
        ) from None
    os.close(fd)


def _mounted(path: str) -> bool:
    try:
        numbers = device_numbers(path)
    except OSError:
        return False
    return any((entry.major, entry.minor) == numbers for entry in mounts.read_mounts())


def openers(path: str) -> list[str]:
    """Processes with `path`'s block device open, as "pid N (command)"; only for error messages.

    By hand: /proc/<pid>/fd scanned for the device number (psutil would add a dependency for
    this one error path). Processes that vanish or hide their fds are skipped."""
    try:
        wanted = os.stat(path).st_rdev
    except OSError:
        return []
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if stat.S_ISBLK(st.st_mode) and st.st_rdev == wanted:
                found.append(f"pid {pid} ({_command(pid)})")
                break
    return found


def _command(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return "?"
