"""ceph-csi's rbd-nbd log file of a volume it staged, handled at its unstage as ceph-csi does.

ceph-csi's rbd-nbd map writes `<logDir>/rbd-nbd-<volume id>.log` and its unstage applies the
StorageClass's `cephLogStrategy` (stashed as `logFileStrategy`) to it once the device is gone;
cephcsi.node.legacy_stage calls `apply_log_strategy` at the same point. The standard library's
gzip does the compression: no tool to run, and the file is streamed, not read into memory.
"""
from __future__ import annotations

import contextlib
import gzip
import logging
import os
import shutil
import stat

from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


def nbd_log_name(volume_id: str) -> str:
    """The rbd-nbd log file ceph-csi's map names (getCephClientLogFileName: `<prefix>-<id>.log`)."""
    return f"rbd-nbd-{volume_id}.log"


def compressed_name(log_name: str) -> str:
    """ceph-csi's GzipLogFile replaces every ".log" by ".gz": `rbd-nbd-<id>.gz`, not `.log.gz`."""
    return log_name.replace(".log", ".gz")


def apply_log_strategy(volume_id: str, log_dir: str, strategy: str) -> None:
    """What ceph-csi's unstage does to the rbd-nbd log file after the unmap: "remove" deletes it,
    "compress" gzips it to compressed_name (replacing an older one) and deletes it, "preserve"
    (or nothing said) leaves it. Never raises: a log file is not worth a failed unstage.
    Only a plain, singly linked file named nbd_log_name directly in log_dir is touched; the
    directory is opened once and every step is relative to it without following symlinks."""
    action = strategy.lower()  # ceph-csi compares case-insensitively
    name = nbd_log_name(volume_id)
    facts = {"volume_id": volume_id, "log_dir": log_dir, "file": name, "strategy": strategy}
    if not log_dir or action in ("", "preserve"):
        return  # ceph-csi acts only when the stash names a directory
    if action not in ("remove", "compress"):
        log.warning("unknown logFileStrategy in ceph-csi's stash (known: remove, compress, preserve); "
                    "rbd-nbd log file left", extra=fields(**facts))
        return
    if not os.path.isabs(log_dir) or "\0" in log_dir + name or "/" in name:
        log.warning("ceph-csi's stash names no usable rbd-nbd log file; nothing touched", extra=fields(**facts))
        return
    try:
        dir_fd = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        log.warning("cannot open the rbd-nbd log directory of ceph-csi's stage (is ceph-csi's cephLogDir "
                    "mounted at the same path in this node plugin?); log file left",
                    extra=fields(**facts, error=str(error)))
        return
    try:
        if action == "remove":
            _check_plain(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))
            os.unlink(name, dir_fd=dir_fd)
        else:
            _compress(name, compressed_name(name), dir_fd)
    except FileNotFoundError:
        # Never written, or handled already by an unstage that was retried after a crash.
        log.debug("no rbd-nbd log file of ceph-csi's stage", extra=fields(**facts))
    except OSError as error:
        log.warning("could not %s the rbd-nbd log file of ceph-csi's stage; left as it is", action,
                    extra=fields(**facts, error=str(error)))
    else:
        log.info("applied ceph-csi's log strategy to the rbd-nbd log file", extra=fields(**facts))
    finally:
        os.close(dir_fd)


def _check_plain(info: os.stat_result) -> None:
    # A hard link's other names are another file: compressing would copy it, possibly more widely readable.
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        raise OSError("not a plain file with a single link")


def _compress(name: str, target: str, dir_fd: int) -> None:
    # O_NONBLOCK: a FIFO planted under either name must fail the open rather than hang the unstage.
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with open(os.open(name, os.O_RDONLY | flags, dir_fd=dir_fd), "rb") as source:
        info = os.fstat(source.fileno())
        _check_plain(info)
        # Truncated only once known to be a plain file of its own: O_TRUNC would empty a hard link's target.
        with open(os.open(target, os.O_WRONLY | os.O_CREAT | flags, 0o600, dir_fd=dir_fd), "wb") as raw:
            _check_plain(os.fstat(raw.fileno()))
            try:
                raw.truncate(0)
                os.fchmod(raw.fileno(), stat.S_IMODE(info.st_mode))
                with gzip.GzipFile(fileobj=raw, mode="wb") as packed:
                    shutil.copyfileobj(source, packed)
                os.fsync(raw.fileno())
            except BaseException:
                # Half a .gz must not pass for the log: drop it, keep the original (as ceph-csi does).
                with contextlib.suppress(OSError):
                    os.unlink(target, dir_fd=dir_fd)
                raise
    os.unlink(name, dir_fd=dir_fd)
