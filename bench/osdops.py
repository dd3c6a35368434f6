"""RADOS round trips, counted by the OSD: every client op (one MOSDOp, however many sub-ops a
compound read or write op holds) adds one to the OSD's `op` counter (`op_r` reads, `op_w`
writes, `op_rw` read-modify-write such as a guarded omap write or a cls call that writes).

The bench's cluster has one OSD and no other clients, so the delta of these counters around a
batch, divided by its ops, is the number of RADOS operations per call. Background work of
the mgr (its rbd_support module polls a few objects) adds a little noise; a trash purge adds
its own ops, which is why deletes are counted together with the drain and compared with the
raw `trash_move + mgr purge` baseline, whose purge is the same.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KEYS = ("op", "op_r", "op_w", "op_rw")


@dataclass(frozen=True)
class OpCounts:
    op: int
    op_r: int
    op_w: int
    op_rw: int

    def minus(self, other: OpCounts) -> OpCounts:
        return OpCounts(self.op - other.op, self.op_r - other.op_r, self.op_w - other.op_w, self.op_rw - other.op_rw)

    def per(self, calls: int) -> dict[str, float]:
        return {k: getattr(self, k) / calls for k in KEYS} if calls else {}


def parse_perf_dump(text: str) -> OpCounts:
    """The OSD's op counters from `ceph tell osd.N perf dump` JSON."""
    doc: dict[str, Any] = json.loads(text)
    osd = doc.get("osd", doc)
    return OpCounts(*(int(osd.get(k, 0)) for k in KEYS))


def read(cluster: Any, osd: int = 0) -> OpCounts:
    """Current counters of osd.N (through the admin CLI; ~0.5 s, never inside a timing)."""
    return parse_perf_dump(cluster.admin("ceph", "tell", f"osd.{osd}", "perf", "dump", "osd"))
