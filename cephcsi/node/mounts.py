"""Mount table reading and mount/unmount/bind operations.

The table is /proc/self/mountinfo, parsed here; filesystem mounts run mount(8) through
cephcsi.node.exec, binds and unmounts use cephcsi.node.mount_syscalls where they can.
Why no library: docs/design/node.md, "The mount table and mounting".
"""
from __future__ import annotations

import errno
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cephcsi.errors import DeadlineExceeded, FailedPrecondition, Internal
from cephcsi.node import mount_syscalls
from cephcsi.node.exec import Runner
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    """Path inside the source filesystem that is mounted (not '/' for bind mounts of a subtree or file)."""
    mount_point: str
    options: tuple[str, ...]
    """Per-mount-point options (ro/rw, nosuid...)."""
    fs_type: str
    source: str
    super_options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options

    @property
    def device_numbers(self) -> tuple[int, int]:
        return (self.major, self.minor)


def unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo_line(line: str) -> MountEntry:
    """One line of /proc/<pid>/mountinfo; raises ValueError on a malformed line."""
    parts = line.rstrip("\n").split(" ")
    try:
        separator = parts.index("-", 6)
    except ValueError:
        raise ValueError(f"mountinfo line without '-' separator: {line!r}") from None
    if len(parts) < separator + 3:
        raise ValueError(f"mountinfo line too short: {line!r}")
    major, _, minor = parts[2].partition(":")
    return MountEntry(
        mount_id=int(parts[0]),
        parent_id=int(parts[1]),
        major=int(major),
        minor=int(minor),
        root=unescape(parts[3]),
        mount_point=unescape(parts[4]),
        options=tuple(parts[5].split(",")),
        fs_type=unescape(parts[separator + 1]),
        source=unescape(parts[separator + 2]),
        super_options=tuple(parts[separator + 3].split(",")) if len(parts) > separator + 3 else (),
    )


def parse_mountinfo(text: str) -> list[MountEntry]:
    return [parse_mountinfo_line(line) for line in text.splitlines() if line.strip()]


def read_mounts(path: str = MOUNTINFO) -> list[MountEntry]:
    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
        return parse_mountinfo(handle.read())


def canonical(path: str) -> str:
    """The path as the kernel shows it in mountinfo (symlinks resolved, no trailing slash)."""
    return os.path.realpath(path)


def mounts_at(path: str, table: Iterable[MountEntry] | None = None) -> list[MountEntry]:
    """Every mount stacked on `path`, bottom first."""
    target = canonical(path)
    return [entry for entry in (read_mounts() if table is None else table) if entry.mount_point == target]


def top_mount(path: str, table: Iterable[MountEntry] | None = None) -> MountEntry | None:
    found = mounts_at(path, table)
    return found[-1] if found else None


def is_mount_point(path: str, table: Iterable[MountEntry] | None = None) -> bool:
    return bool(mounts_at(path, table))


def mounts_sharing(anchor: MountEntry, table: Iterable[MountEntry] | None = None) -> list[MountEntry]:
    """Other mounts that expose what `anchor` mounts: binds of the same filesystem (or subtree of
    it), or binds of the same device node. Used to find publishes of a staged volume.

    Matching is by (major:minor, root) rather than by source name: a bind mount of a device node
    (/dev/loop3 onto a file) shows the devtmpfs numbers and root "/loop3", never the loop device.
    """
    entries = read_mounts() if table is None else table
    prefix = anchor.root.rstrip("/") + "/"
    return [
        e for e in entries
        if e.mount_point != anchor.mount_point
        and (e.major, e.minor) == (anchor.major, anchor.minor)
        and (e.root == anchor.root or e.root.startswith(prefix))
    ]


def path_state(path: str) -> str:
    """'missing', 'ok', or 'broken' (ENOTCONN/EIO...: a mount whose backend went away)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        if error.errno in (errno.ENOTCONN, errno.EIO, errno.ESTALE, errno.EACCES, errno.ENXIO):
            return "broken"
        raise
    return "ok"


def probe_path(path: str, timeout: float) -> str:
    """path_state() that cannot hang the caller on a stuck FUSE daemon: the stat runs in a
    helper thread, and after `timeout` the call fails (the thread is left to finish or hang)."""
    outcome: dict[str, str] = {}

    def probe() -> None:
        try:
            outcome["state"] = path_state(path)
        except OSError as error:
            outcome["state"] = f"error: {error.strerror}"

    worker = threading.Thread(target=probe, name="path-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise DeadlineExceeded(f"{path} did not answer within {timeout:g}s (its FUSE daemon or Ceph is stuck?)")
    return outcome["state"]


def remove_mount_point(path: str, not_empty: str) -> None:
    """Remove an unmounted mount point: an empty directory, or the empty file a block volume is
    bound onto. Anything holding data stays, with `not_empty` (what to do) in the error."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.isfile(path) and os.path.getsize(path) == 0:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno == errno.ENOTEMPTY:
            raise FailedPrecondition(f"{path} is not a mount point but is not empty; {not_empty}") from None
        raise Internal(f"cannot remove {path}: {error.strerror}") from None


def _syscall(what: str, call: Callable[..., None], *args: object) -> None:
    try:
        call(*args)
    except OSError as error:
        raise Internal(f"{what} failed: {error.strerror}") from None


class Mounter:
    """mount/umount through the command runner; every operation is idempotent."""

    def __init__(self, runner: Runner, timeout: float) -> None:
        self.run = runner
        self.timeout = timeout

    def mount(self, source: str, target: str, fs_type: str, options: Sequence[str]) -> None:
        argv = ["mount", "-t", fs_type]
        if options:
            argv += ["-o", ",".join(options)]
        self.run([*argv, source, target], what=f"mount {source} at {target}", timeout=self.timeout)

    def bind(self, source: str, target: str, read_only: bool = False, options: Sequence[str] = ()) -> None:
        """Bind mount; read-only needs a second remount step (the kernel ignores ro on MS_BIND)."""
        flags = [flag for flag in options if flag not in ("rw", "ro", "bind", "remount")]
        if not mount_syscalls.supported(flags):
            self._bind_with_mount8(source, target, read_only, flags)
            return
        what = f"bind mount {source} at {target}"
        _syscall(what, mount_syscalls.bind, source, target)
        log.debug("bind mounted", extra=fields(source=source, target=target))
        if read_only or flags:
            try:
                entry = top_mount(target, read_mounts())
                _syscall(f"remount {target} {'read-only' if read_only else 'with ' + ','.join(flags)}",
                         mount_syscalls.remount_bind, target, ["ro" if read_only else "rw", *flags],
                         entry.options if entry is not None else ())
            except Exception:
                # Never leave a writable bind behind when read-only was asked for.
                self.unmount(target)
                raise

    def _bind_with_mount8(self, source: str, target: str, read_only: bool, flags: Sequence[str]) -> None:
        """mount(8) for options beyond the per-mount flags mount_syscalls knows."""
        self.run(["mount", "--bind", source, target], what=f"bind mount {source} at {target}", timeout=self.timeout)
        remount = ["remount", "bind", "ro" if read_only else "rw", *flags]
        try:
            self.run(
                ["mount", "-o", ",".join(remount), target],
                what=f"remount {target} with {','.join(remount[2:])}",
                timeout=self.timeout,
            )
        except Exception:
            self.unmount(target)
            raise

    def unmount(self, target: str) -> None:
        """Unmount everything stacked on target. Missing or not-mounted targets are fine."""
        for _ in range(8):  # stacked mounts from earlier crashed attempts; bounded to stay sane
            if not is_mount_point(target):
                return
            try:
                unmounted = mount_syscalls.unmount(target)
            except OSError as error:
                if error.errno == errno.EBUSY:
                    raise FailedPrecondition(
                        f"cannot unmount {target}: it is busy (a process still uses files on the volume); "
                        "stop it and retry"
                    ) from None
                raise Internal(f"cannot unmount {target}: {error.strerror}") from None
            if not unmounted and not is_mount_point(target):
                return  # raced with someone else's unmount
            log.info("unmounted", extra=fields(path=target))
        if is_mount_point(target):
            raise FailedPrecondition(f"{target} still has mounts stacked on it after 8 unmounts; inspect it by hand")
