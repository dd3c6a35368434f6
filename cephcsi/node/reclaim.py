"""The node half of reclaiming space: `fstrim` on a staged filesystem volume. docs/reclaim-space.md.

Only read-write filesystem stages whose top mount is the volume's own device are trimmed (not
Block, read-only or LUKS volumes: `why_not`); the trim holds the per-volume lock non-blocking
and runs at most TRIM_TIMEOUT. docs/design/node.md, "What is trimmed".
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from cephcsi.node import devices, exec as node_exec, mounts, stage_record
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

TRIMMED_BYTES = Counter(
    "cephcsi_node_trimmed_bytes_total",
    "Bytes fstrim discarded on staged volumes of this node (freed filesystem blocks handed back to RADOS).",
)
TRIMS = Counter("cephcsi_node_trims_total", "Node trims of staged volumes, by outcome.", ["outcome"])

_TRIMMED = re.compile(r"\((\d+) bytes\) trimmed|(\d+) bytes were trimmed|:\s*(\d+) bytes trimmed")

TRIMMED, SKIPPED, FAILED = "trimmed", "skipped", "failed"

TRIM_TIMEOUT = 600.0
"""fstrim's own bound, longer than other commands': a trim walks every free extent of the
filesystem and sends each discard through the mapper to RADOS, minutes on a big, fragmented
XFS. The volume's lock is held meanwhile, so it is bounded still; a trim that runs out is
recorded as failed and waits for the leader's next run (never retried pass after pass)."""


@dataclass(frozen=True)
class TrimResult:
    volume_id: str
    outcome: str
    """trimmed | skipped | failed."""
    trimmed_bytes: int = 0
    reason: str = ""


def trimmed_bytes(stdout: str) -> int:
    """fstrim -v's count (util-linux prints `<path>: 1.2 GiB (1288490188 bytes) trimmed`)."""
    found = _TRIMMED.search(stdout)
    if found is None:
        return 0
    return int(next(group for group in found.groups() if group is not None))


def why_not(record: stage_record.StageRecord) -> str:
    """Why a staged volume is not trimmed on the node ('' when it is)."""
    if not record.staged:
        return "not completely staged"
    if record.access_type != stage_record.ACCESS_MOUNT:
        return "a Block volume: only the application knows its free ranges (the controller sparsifies it when unused)"
    if record.read_only:
        return "staged read-only"
    if record.crypt_name:
        # The LUKS mapping is opened without allow-discards (as ceph-csi opens it): a discard
        # would tell the storage which blocks are free, so fstrim could only fail.
        return "LUKS-encrypted: its dm-crypt mapping does not pass discards"
    return ""


def trim(record: stage_record.StageRecord, runner: node_exec.Runner, timeout: float = TRIM_TIMEOUT,
         table: list[mounts.MountEntry] | None = None,
         device_numbers: Callable[[str], tuple[int, int]] | None = None) -> TrimResult:
    """fstrim the volume's staging mount. The caller holds the volume's lock. A failing fstrim
    raises (the caller records it)."""
    reason = why_not(record)
    if reason:
        return _done(TrimResult(record.volume_id, SKIPPED, reason=reason))
    path = record.mount_path
    entry = mounts.top_mount(path, table if table is not None else mounts.read_mounts())
    if entry is None or os.path.realpath(entry.mount_point) != os.path.realpath(path):
        return _done(TrimResult(record.volume_id, SKIPPED, reason=f"{path} is not mounted; stage the volume again"))
    reason = _not_the_volumes(record, entry, device_numbers or devices.device_numbers)
    if reason:
        log.warning("staging mount is not the volume's device; not trimmed",
                    extra=fields(volume_id=record.volume_id, path=path, reason=reason))
        return _done(TrimResult(record.volume_id, SKIPPED, reason=reason))
    if "ro" in entry.options:
        return _done(TrimResult(record.volume_id, SKIPPED, reason="mounted read-only"))
    if "ro" in entry.super_options:
        return _done(TrimResult(record.volume_id, SKIPPED, reason=(
            "its filesystem is read-only although mounted rw: the kernel remounted it read-only after an error "
            "(errors=remount-ro); check the node's kernel log and fsck the volume")))
    result = runner(["fstrim", "-v", path], what=f"trim the filesystem of volume {record.volume_id}", timeout=timeout)
    done = TrimResult(record.volume_id, TRIMMED, trimmed_bytes(result.stdout))
    TRIMMED_BYTES.inc(done.trimmed_bytes)
    log.info("volume trimmed", extra=fields(volume_id=record.volume_id, path=path, trimmed=done.trimmed_bytes))
    return _done(done)


def failed(volume_id: str, reason: str) -> TrimResult:
    """The result of an fstrim that raised (counted like the others)."""
    return _done(TrimResult(volume_id, FAILED, reason=reason))


def _not_the_volumes(record: stage_record.StageRecord, entry: mounts.MountEntry,
                     device_numbers: Callable[[str], tuple[int, int]]) -> str:
    """Why the mount `entry` at the staging path is not the volume's filesystem ('' when it is)."""
    device = record.data_device
    if not device:
        return "its stage record names no device"
    try:
        wanted = device_numbers(device)
    except OSError as error:
        return f"its device {device} is gone ({error.strerror}); stage the volume again"
    if (entry.major, entry.minor) != wanted:
        return (f"the mount at {entry.mount_point} is of device {entry.major}:{entry.minor} ({entry.source}), not the "
                f"volume's {device} ({wanted[0]}:{wanted[1]})")
    return ""


def _done(result: TrimResult) -> TrimResult:
    TRIMS.labels(result.outcome).inc()
    if result.outcome == SKIPPED:
        log.debug("volume not trimmed", extra=fields(volume_id=result.volume_id, reason=result.reason))
    elif result.outcome == FAILED:
        log.warning("trim failed; tried again after the leader's next recorded run",
                    extra=fields(volume_id=result.volume_id, error=result.reason))
    return result
