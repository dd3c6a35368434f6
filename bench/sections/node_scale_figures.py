"""Section 2c's figures: what it measures (Figures, Reading) and the pure helpers that read and
compare them (unit-tested in tests/unit/bench/test_node_scale.py). The section itself:
bench/sections/node_scale.py; its tables: node_scale_report.py."""
from __future__ import annotations

import functools
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench import machine, procstat, report
from bench.environment import DRIVER_ARGS, Environment, mounts_under
from bench.load import Batch, run_batch
from bench.model import SectionResult, Status, Table
from bench.options import Options
from bench.raw import RawRbd
from bench.sections import node_ops
from bench.sections.base import Section
from bench.stats import Spread, percentile, ratio, spread
from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.node.mappers.loops import attached_loops
from tests.integration.driver import DriverProcess

DEFAULT_VOLUMES = 100
QUICK_VOLUMES = 10
ENDS = 10
"""How many volumes at each end of the sequence are compared (first ENDS against last ENDS)."""
BASELINE_CYCLES = 3
STATS_CONCURRENCY = 8
KUBELET_STATS_PERIOD_S = 60.0
"""The kubelet's --volume-stats-agg-period default: it asks every volume's stats once per period."""
RESTART_GOAL_S = 10.0


# ---- pure helpers (unit-tested) ------------------------------------------------------------------


def volume_count(options: Options) -> int:
    """--node-volumes, else 10 with --quick and 100 otherwise."""
    chosen = options.extra.get("node_volumes")
    if chosen is not None:
        return int(chosen)
    return QUICK_VOLUMES if options.quick else DEFAULT_VOLUMES


@dataclass(frozen=True)
class Ends:
    """The first k and the last k samples of a sequence, and how the two compare."""

    k: int
    first: Spread
    last: Spread

    @property
    def ratio(self) -> float | None:
        """Median of the last k over the median of the first k."""
        return ratio(self.last.median, self.first.median)

    @property
    def as_fast(self) -> bool:
        """The last k's median is no slower than the first k's upper quartile: 'as fast ± spread'.
        Not their maximum: on a shared box one stalled call among the first would pass anything."""
        return self.last.median <= self.first.q3

    def verdict(self) -> str:
        word = "within the first's upper quartile" if self.as_fast else "above the first's upper quartile"
        return f"{report.times(self.ratio)}, {word}"

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "first": self.first.to_json(), "last": self.last.to_json(), "ratio": self.ratio,
                "as_fast": self.as_fast}


def ends(samples: Sequence[float], k: int = ENDS) -> Ends | None:
    """First k against last k (k shrinks to half the samples so the two never overlap); None for
    fewer than two samples."""
    k = min(k, len(samples) // 2)
    if k < 1:
        return None
    return Ends(k=k, first=spread(samples[:k]), last=spread(samples[-k:]))


def per_volume(before: float, after: float, volumes: int) -> float | None:
    """Growth per volume between two readings (None without volumes)."""
    return (after - before) / volumes if volumes > 0 else None


def rbd_fuse_daemons(root: str, proc: str = "/proc") -> dict[int, str]:
    """Live rbd-fuse processes whose argv names a path under root: pid → that path (the last such
    argument, the mount point; the -c ceph.conf beside it is under root too)."""
    prefix = os.fsencode(os.path.realpath(root).rstrip("/") + "/")
    found: dict[int, str] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as handle:
                argv = [a for a in handle.read().split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile
        if not argv or os.path.basename(argv[0]) != b"rbd-fuse":
            continue
        under = [a for a in argv[1:] if a.startswith(prefix)]
        if under:
            found[int(entry)] = os.fsdecode(under[-1])
    return found


def loops_under(root: str, sys_block: str | None = None) -> list[str]:
    """Attached loop devices whose backing file is under root."""
    prefix = os.path.realpath(root).rstrip("/") + "/"
    return [device for device, backing in attached_loops(sys_block) if backing.startswith(prefix)]


def count(flags: Sequence[bool]) -> str:
    return f"{sum(flags)}/{len(flags)}"


def _fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


@dataclass
class Reading:
    """The plugin's /proc figures at one moment."""

    label: str
    sample: procstat.ProcessSample
    fds: int | None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, **self.sample.to_json(), "fds": self.fds}


def _read(label: str, pid: int) -> Reading:
    return Reading(label, procstat.sample(pid), _fds(pid))


@dataclass
class Figures:
    """Everything the section measured, filled in as it goes (a failure keeps what was reached)."""

    volumes: int
    first_start_s: float | None = None
    restart_s: float | None = None
    readings: list[Reading] = field(default_factory=list)
    series: list[dict[str, float | int | None]] = field(default_factory=list)
    """Per volume, in stage order: its stage/publish latency and the plugin's RSS/threads after it."""
    stage: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    unpublish: list[float] = field(default_factory=list)
    unstage: list[float] = field(default_factory=list)
    stage_cpu: list[float] = field(default_factory=list)
    """The plugin's CPU seconds over each volume's stage+publish (/proc ticks: 10 ms steps)."""
    manual_empty: node_ops.Timings = field(default_factory=node_ops.Timings)
    manual_full: node_ops.Timings = field(default_factory=node_ops.Timings)
    stats: dict[str, Batch[bool]] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    fuse_rss_bytes: int | None = None
    fuse_threads: int | None = None
    leftovers: dict[str, list[str]] = field(default_factory=dict)
