"""Named crash points for the crash-consistency tests.

`CEPHCSI_FAILPOINTS=create.after-reserve,delete.after-trash` makes the process SIGKILL itself
when it reaches one of those points, which is exactly what a node losing power looks like to
Ceph. Unset in production: then `reach` is a set lookup on an empty set.
"""
from __future__ import annotations

import os
import signal

_ARMED = frozenset(p.strip() for p in os.environ.get("CEPHCSI_FAILPOINTS", "").split(",") if p.strip())


def reach(point: str) -> None:
    if point in _ARMED:
        os.kill(os.getpid(), signal.SIGKILL)
