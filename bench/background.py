"""A synthetic background load the bench applies itself: N processes that each keep one CPU
busy (a pure-Python spin loop, niceness 0 like everything else on the box), so a reader sees
how the driver/floor ratios move when the machine is not quiet.

The driver is CPU-bound (Python per call) while its floors mostly wait on the OSD, so a busy
CPU stretches the driver's side more than the floor's; quoting both states keeps a figure from
depending on whatever else the machine happened to be doing.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bench import machine

log = logging.getLogger("bench")

SPIN = "while True:\n    pass\n"


def label(hogs: int) -> str:
    """How a load state is printed in the tables."""
    if hogs <= 0:
        return "no added load"
    return f"+{hogs} CPU-busy process" + ("es" if hogs > 1 else "")


def parse_levels(text: str) -> tuple[int, ...]:
    """'0,1' → (0, 1): how many CPU-busy processes each pass runs with (duplicates dropped)."""
    try:
        values = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"{text!r} is not a comma list of integers") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"{text!r}: background load levels must be ≥ 0")
    return values


@contextmanager
def cpu_hogs(count: int, settle_s: float = 1.0) -> Iterator[list[int]]:
    """Run `count` CPU-busy processes for the duration of the block; yields their pids.
    They are stopped (by pid, SIGKILL) on the way out, also on errors."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(max(0, count)):
            procs.append(subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if procs:
            log.info("background load: %d CPU-busy process(es) %s", len(procs), [p.pid for p in procs])
            time.sleep(settle_s)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def passes(levels: Sequence[int]) -> Iterator[tuple[int, dict[str, str]]]:
    """For each level: run the caller's block under that many hogs; yields (hogs, state) where
    state records the machine during the block: load average at its start and end, and the
    share of all CPUs that was busy over it (from /proc/stat, everything on the box: the
    cluster, the driver, the bench, the hogs and whatever else runs)."""
    for hogs in levels:
        with cpu_hogs(hogs):
            state: dict[str, str] = {"load": label(hogs), "loadavg_start": machine.loadavg()}
            jiffies = machine.cpu_now()
            yield hogs, state
            state["loadavg_end"] = machine.loadavg()
            busy = machine.busy_fraction(jiffies, machine.cpu_now())
            state["cpu_busy"] = "—" if busy is None else f"{busy * 100:.0f}%"
