"""Named crash and pause points for the crash-consistency and race tests.

`CEPHCSI_FAILPOINTS=create.after-reserve,delete.after-trash` makes the process SIGKILL itself
when it reaches one of those points, which is exactly what a node losing power looks like to
Ceph. `delete.after-image:pause=2` instead sleeps there for 2 s, so a test can run another
driver process against the half-done state. Unset in production: then `reach` is a dict
lookup on an empty dict.
"""
from __future__ import annotations

import os
import signal
import time


def _parse(text: str) -> dict[str, float | None]:
    """point → seconds to pause, or None to SIGKILL."""
    armed: dict[str, float | None] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        point, _, action = item.partition(":")
        armed[point] = float(action.removeprefix("pause=")) if action.startswith("pause=") else None
    return armed


_ARMED = _parse(os.environ.get("CEPHCSI_FAILPOINTS", ""))


def reach(point: str) -> None:
    if point not in _ARMED:
        return
    pause = _ARMED[point]
    if pause is None:
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(pause)
