"""Section 2c's tables and JSON data, from the Figures the section filled in."""
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
from bench.sections.node_scale_figures import (BASELINE_CYCLES, KUBELET_STATS_PERIOD_S, RESTART_GOAL_S,
                                                STATS_CONCURRENCY, Figures, count, ends, per_volume)


def _median(samples: Sequence[float]) -> float | None:
    return percentile(samples, 50) if samples else None


def _cell(s: Spread | None) -> str:
    return "—" if s is None else f"{s.median * 1000:.1f} ({s.low * 1000:.1f}–{s.high * 1000:.1f})"


def _sum(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x + y for x, y in zip(a, b)]


def _latency_table(f: Figures) -> tuple[Table, dict[str, Any]]:
    e = ends(f.stage)
    k = e.k if e else 0
    table = Table(title=f"latency in ms over the {f.volumes} volumes in turn: the first {k} against the last {k} "
                        "(median (min–max)); by hand = section 2's steps (rbd-fuse, losetup, mkfs.ext4, mount; "
                        f"bind mount), {BASELINE_CYCLES} cycles with nothing staged and {BASELINE_CYCLES} beside the "
                        f"{f.volumes} staged volumes, median",
                  columns=["steps", f"first {k}", f"last {k}", "last / first", "by hand, 0 staged",
                           f"by hand, {f.volumes} staged", "first ÷ by hand (0)", f"last ÷ by hand ({f.volumes})"])
    rows: list[tuple[str, list[float], list[float], list[float]]] = [
        ("stage+publish", _sum(f.stage, f.publish), f.manual_empty.up(), f.manual_full.up()),
        ("  stage", f.stage, f.manual_empty.stage, f.manual_full.stage),
        ("  publish", f.publish, f.manual_empty.publish, f.manual_full.publish),
        ("unpublish+unstage", _sum(f.unpublish, f.unstage), f.manual_empty.down(), f.manual_full.down()),
        ("  unpublish", f.unpublish, f.manual_empty.unpublish, f.manual_full.unpublish),
        ("  unstage", f.unstage, f.manual_empty.unstage, f.manual_full.unstage),
    ]
    data: dict[str, Any] = {}
    cpu = ends(f.stage_cpu)
    data["plugin cpu per stage+publish"] = cpu.to_json() if cpu else None
    for label, samples, empty, full in rows:
        got = ends(samples)
        m0, mn = _median(empty), _median(full)
        data[label.strip()] = got.to_json() if got else None
        table.add(label, _cell(got.first if got else None), _cell(got.last if got else None),
                  got.verdict() if got else "—", report.ms(m0), report.ms(mn),
                  report.times(ratio(got.first.median, m0) if got and m0 else None),
                  report.times(ratio(got.last.median, mn) if got and mn else None))
        if label == "  publish":
            table.add("  the plugin's CPU in stage+publish", _cell(cpu.first if cpu else None),
                      _cell(cpu.last if cpu else None), cpu.verdict() if cpu else "—", "—", "—", "—", "—")
    return table, data


def _process_table(f: Figures) -> Table:
    table = Table(title="the node plugin process (/proc/<pid>/status, /proc/<pid>/fd)",
                  columns=["when", "VmRSS MiB", "VmHWM MiB", "threads", "open fds"])
    for r in f.readings:
        table.add(r.label, report.mib(r.sample.rss_bytes), report.mib(r.sample.hwm_bytes), r.sample.threads,
                  "—" if r.fds is None else r.fds)
    if len(f.readings) >= 2:
        empty, full = f.readings[0], f.readings[1]
        rss = per_volume(empty.sample.rss_bytes, full.sample.rss_bytes, f.volumes)
        threads = per_volume(empty.sample.threads, full.sample.threads, f.volumes)
        fds = per_volume(empty.fds, full.fds, f.volumes) if empty.fds is not None and full.fds is not None else None
        table.add("per staged volume (staged − started) / N", "—" if rss is None else f"{rss / 1024:.1f} KiB", "—",
                  report.num(threads, 2), report.num(fds, 2))
    if f.fuse_rss_bytes is not None:
        table.add(f"the {f.volumes} rbd-fuse daemons together (the mapping, not the plugin)",
                  report.mib(f.fuse_rss_bytes), "—", f.fuse_threads, "—")
    return table


def _stats_table(f: Figures) -> Table:
    table = Table(title=f"NodeGetVolumeStats of all {f.volumes} volumes against the kubelet's "
                        f"{KUBELET_STATS_PERIOD_S:.0f} s period (--volume-stats-agg-period)",
                  columns=["batch", "total s", "p50 ms", "p99 ms", "healthy", "errors", "share of the period"])
    for label, batch in f.stats.items():
        healthy = sum(1 for r in batch.results if r)
        table.add(label, f"{batch.wall_s:.2f}", report.ms(_median(batch.latencies)),
                  report.ms(percentile(batch.latencies, 99) if batch.latencies else None),
                  f"{healthy}/{f.volumes}", len(batch.errors), f"{batch.wall_s / KUBELET_STATS_PERIOD_S * 100:.1f}%")
    return table


def _restart_table(f: Figures) -> Table:
    table = Table(title="start and SIGKILL + restart: launch → Probe and NodeGetCapabilities answered",
                  columns=["figure", "value"])
    table.add("start with nothing staged, s", report.num(f.first_start_s, 2))
    table.add(f"restart after SIGKILL with {f.volumes} staged, s", report.num(f.restart_s, 2))
    for label, value in f.checks.items():
        table.add(label, value)
    return table


def _goals(f: Figures) -> Table:
    table = Table(title="issue 38, deliverable 5 (node at scale)", columns=["goal", "measured", "verdict"])
    up = ends(_sum(f.stage, f.publish))
    table.add(f"stage+publish of the last {up.k if up else 0} as fast as the first (± spread)",
              up.verdict() if up else "—", "met" if up and up.as_fast else "NOT met")
    floor0, floorn = _median(f.manual_empty.up()), _median(f.manual_full.up())
    if up and floor0 and floorn:
        first_x, last_x = up.first.median / floor0, up.last.median / floorn
        table.add(f"the same against the floor measured beside it (by hand with 0, then {f.volumes} staged)",
                  f"{report.times(first_x)} → {report.times(last_x)} the floor "
                  f"(the floor itself {report.times(floorn / floor0)})",
                  "informational: how much of the slowdown is the host's")
    intact = [v for k, v in f.checks.items() if k != "plugin CPU per stage+publish, ms"]
    all_intact = bool(intact) and all(v.split("/")[0] == v.split("/")[1] for v in intact)
    restart_ok = f.restart_s is not None and f.restart_s <= RESTART_GOAL_S
    table.add(f"restart to serving ≤ {RESTART_GOAL_S:.0f} s, every mount intact",
              f"{report.num(f.restart_s, 2)} s; " + ", ".join(f"{k}: {v}" for k, v in f.checks.items()
                                                             if k != "plugin CPU per stage+publish, ms"),
              "met" if restart_ok and all_intact else "NOT met")
    seq = f.stats.get("all staged, c=1")
    table.add(f"NodeGetVolumeStats of all {f.volumes} within the kubelet's {KUBELET_STATS_PERIOD_S:.0f} s",
              "—" if seq is None else f"{seq.wall_s:.2f} s sequential",
              "met" if seq and not seq.errors and seq.wall_s <= KUBELET_STATS_PERIOD_S else "NOT met")
    full = f.readings[1].sample.rss_bytes if len(f.readings) >= 2 else None
    table.add("RSS reported", f"{report.mib(full)} MiB with {f.volumes} staged", "reported" if full else "—")
    table.add("nothing left mounted, attached or running afterwards",
              "; ".join(f"{k}: {len(v)}" for k, v in f.leftovers.items()) or "nothing left",
              "met" if not f.leftovers else "NOT met")
    return table


def _data(f: Figures, latency: dict[str, Any]) -> dict[str, Any]:
    return {
        "volumes": f.volumes, "first_start_s": f.first_start_s, "restart_s": f.restart_s,
        "readings": [r.to_json() for r in f.readings], "series": f.series, "ends": latency,
        "latencies": {"stage": f.stage, "publish": f.publish, "unpublish": f.unpublish, "unstage": f.unstage},
        "manual_empty": f.manual_empty.to_json(), "manual_full": f.manual_full.to_json(),
        "stats": {k: {"wall_s": b.wall_s, "latencies": b.latencies, "healthy": sum(1 for r in b.results if r),
                      "errors": b.errors} for k, b in f.stats.items()},
        "checks": f.checks, "fuse_rss_bytes": f.fuse_rss_bytes, "fuse_threads": f.fuse_threads,
        "leftovers": f.leftovers,
    }
