"""How many bytes a pool can still take: its `max_avail` in `ceph df`, bounded by its quota (a
reached object quota means none). Two read-only mon commands. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import rados

from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import Internal, NotFound, PermissionDenied, Unavailable

_ENOENT, _EPERM, _EACCES = 2, 1, 13


@dataclass(frozen=True)
class PoolCapacity:
    """One pool's room, as the monitors reported it in one read."""

    pool: str
    max_avail: int
    """`ceph df`'s max_avail: bytes a client can still write before the fullest OSD is full."""
    quota_bytes: int = 0
    """The pool's byte quota (0: none)."""
    quota_objects: int = 0
    """The pool's object quota (0: none)."""
    stored_bytes: int = 0
    """Bytes stored in the pool, as the quota counts them."""
    objects: int = 0

    @property
    def quota_room(self) -> int | None:
        """Bytes the quota still allows (None without a byte quota)."""
        if not self.quota_bytes:
            return None
        return max(0, self.quota_bytes - self.stored_bytes)

    @property
    def objects_exhausted(self) -> bool:
        return bool(self.quota_objects) and self.objects >= self.quota_objects

    @property
    def available(self) -> int:
        """What a new volume's data can still use: max_avail, capped by the quota."""
        if self.objects_exhausted:
            return 0
        room = self.quota_room
        return self.max_avail if room is None else min(self.max_avail, room)


def read(handle: rados.Rados, pool: str, timeout: float) -> PoolCapacity:
    """The room left in `pool`; NotFound when the cluster has no such pool."""
    df = _command(handle, {"prefix": "df", "format": "json"}, "read pool usage (ceph df)", pool, timeout)
    stats = _pool_stats(df, pool)
    quota = _command(handle, {"prefix": "osd pool get-quota", "pool": pool, "format": "json"},
                     "read pool quota", pool, timeout)
    return parse(pool, stats, quota)


def parse(pool: str, stats: dict[str, Any], quota: dict[str, Any]) -> PoolCapacity:
    """A PoolCapacity from one pool's `df` stats and its `osd pool get-quota` answer."""
    try:
        max_avail = int(stats["max_avail"])
    except (KeyError, TypeError, ValueError):
        raise Internal(f"ceph df gave no max_avail for pool {pool!r}: {stats!r}") from None
    # `current_num_*` is what the monitors compare with the quota; `df`'s own counts are the
    # same sums, used if a release does not print them.
    return PoolCapacity(
        pool=pool,
        max_avail=max(0, max_avail),
        quota_bytes=_int(quota.get("quota_max_bytes")),
        quota_objects=_int(quota.get("quota_max_objects")),
        stored_bytes=_int(quota.get("current_num_bytes", stats.get("stored", stats.get("bytes_used")))),
        objects=_int(quota.get("current_num_objects", stats.get("objects"))),
    )


def _pool_stats(df: dict[str, Any], pool: str) -> dict[str, Any]:
    for entry in df.get("pools") or []:
        if isinstance(entry, dict) and entry.get("name") == pool:
            stats = entry.get("stats")
            if isinstance(stats, dict):
                return stats
    raise NotFound(f"pool {pool!r} does not exist (it is not in ceph df)")


def _command(handle: rados.Rados, command: dict[str, str], what: str, pool: str, timeout: float) -> dict[str, Any]:
    with ceph_call(what, f"pool {pool!r}"):
        ret, out, status = handle.mon_command(json.dumps(command), b"", timeout=max(1, int(timeout)))
    if ret == -_ENOENT:
        raise NotFound(f"pool {pool!r} does not exist ({what}: {status.strip()})")
    if ret in (-_EPERM, -_EACCES):
        raise PermissionDenied(f"Ceph refused to {what} for pool {pool!r} ({status.strip()}): the cephx user "
                               "needs mon 'profile rbd' (or at least mon 'allow r')")
    if ret != 0:
        raise Unavailable(f"{what} for pool {pool!r} failed ({ret}): {status.strip()}; retry")
    try:
        doc = json.loads(out.decode() or "{}")
    except ValueError:
        raise Internal(f"{what} for pool {pool!r}: the monitors' answer is not JSON") from None
    if not isinstance(doc, dict):
        raise Internal(f"{what} for pool {pool!r}: unexpected answer {doc!r}")
    return doc


def _int(value: object) -> int:
    if not isinstance(value, (int, str)):
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0
