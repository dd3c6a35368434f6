"""Section 1: CreateVolume/DeleteVolume through the gRPC socket of a real
`cephcsi --mode=controller --sidecars=none`, and in-process as the embedded provisioner calls
them (bench.embedded: the same servicer, no gRPC hop, with the claim's owner keys that deploy/'s
`--extra-create-metadata` makes it send), beside raw python-rbd at the same
concurrency on the same cluster in the same run.

Baselines:
  create  ↔ RBD().create of the same size and features.
  delete  ↔ three of them, because the driver's delete is not a plain remove:
    * RBD().remove — the classic synchronous delete, O(image objects);
    * trash_move + trash_remove — the same purge, through the trash;
    * trash_move + `rbd task add trash remove` (mgr) — the Ceph work the driver's delete really
      does before it answers (the purge runs later in the mgr). This is the like-for-like floor
      for the driver's latency; the other two show what a caller would wait for otherwise.
  The trash is drained (mgr purge finished) after every batch that leaves work in it, so a
  background purge never slows the next batch; the drain time is reported.

Figures that hold: each concurrency level runs `--rounds` interleaved rounds (gRPC side,
in-process side, raw side, the first side rotating), so slow drift on a shared machine hits every side; the
ratios are per round, reported as the median with min–max. With `--background-load 0,1` the
whole section runs once quiet and once beside a CPU-busy process the bench starts itself.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench import background, osdops, procstat, profile, report
from bench.controller_calls import RPC_TIMEOUT_S, DriverClient, EmbeddedClient, SideCall, in_process
from bench.environment import Environment
from bench.go_caller import GoCaller
from bench.load import WAVES, Batch, ops_per_round, run_batch
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from bench.stats import Spread, Summary, percentile, pooled, ratio_spread, spread

log = logging.getLogger("bench")

NAME = "controller"
TITLE = "1. CreateVolume/DeleteVolume: driver over gRPC and in-process vs raw python-rbd"


def _names(kind: str, concurrency: int, count: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"bench-{kind}-c{concurrency}-{run}-{i}" for i in range(count)]


def _cpu_ms_per_op(before: float, after: float, ops: int) -> float | None:
    return (after - before) * 1000 / ops if ops else None


def _check(batch: Batch[Any], what: str, notes: list[str]) -> None:
    if batch.errors:
        notes.append(f"{what}: {len(batch.errors)} of {len(batch.errors) + len(batch.latencies)} failed; "
                     f"first: {batch.errors[0]}")


BATCHES = ("driver_create", "driver_delete", "embedded_create", "embedded_delete", "raw_create", "raw_remove",
           "raw_trash_remove", "raw_trash_mgr")
"""Per round: the driver's create and delete over gRPC and in-process; raw create, and the three raw deletes."""
PATHS = (("driver", ""), ("embedded", "in-process"))
"""(batch prefix, label): the driver over gRPC, and in-process (ratio keys prefixed `embedded_`)."""
BASELINES = (("raw_remove", "RBD.remove"), ("raw_trash_remove", "trash_move+trash_remove"),
             ("raw_trash_mgr", "trash_move+mgr purge"))


def _calls_side(env: Environment, prefix: str, what: str, create: SideCall, delete: SideCall,
                raw: RawRbd, c: int, k: int, notes: list[str]) -> dict[str, Any]:
    """One round of one path (`prefix` driver: over gRPC from the Go caller, the cephcsi process's
    CPU clock and the caller's own; embedded: in-process, this process's): k creates then their
    k deletes at concurrency c, then the drain."""
    created = create(_names(prefix[:3], c, k), c)
    deleted = delete(created.batch.results, c)
    _check(created.batch, f"c={c} {what} CreateVolume", notes)
    _check(deleted.batch, f"c={c} {what} DeleteVolume", notes)
    return {f"{prefix}_create": created.batch, f"{prefix}_delete": deleted.batch,
            f"{prefix}_cpu_create": _cpu_ms_per_op(0.0, created.driver_cpu_s, len(created.batch.latencies)),
            f"{prefix}_cpu_delete": _cpu_ms_per_op(0.0, deleted.driver_cpu_s, len(deleted.batch.latencies)),
            **({f"{prefix}_caller_cpu_create": _cpu_ms_per_op(0.0, created.caller_cpu_s,
                                                              len(created.batch.latencies))}
               if created.caller_cpu_s is not None else {}),
            f"drain_{prefix}_s": raw.wait_trash_empty(env.options.drain_timeout_s)}


def _raw_side(env: Environment, raw: RawRbd, c: int, k: int, notes: list[str]) -> dict[str, Any]:
    """One baseline round: create + remove; create + trash_move/trash_remove; create +
    trash_move/mgr purge; then the drain. CPU is the bench process's own (os.times)."""
    s0 = procstat.self_cpu_seconds()
    raw_created = run_batch(raw.create, [raw.new_name() for _ in range(k)], c)
    s1 = procstat.self_cpu_seconds()
    removed = run_batch(raw.remove, raw_created.results, c)
    second = run_batch(raw.create, [raw.new_name() for _ in range(k)], c)
    trash_removed = run_batch(raw.trash_move_remove, raw.ids(second.results), c)
    third = run_batch(raw.create, [raw.new_name() for _ in range(k)], c)
    s3 = procstat.self_cpu_seconds()
    mgr_purged = run_batch(raw.trash_move_mgr_purge, raw.ids(third.results), c)
    s4 = procstat.self_cpu_seconds()
    for batch, what in ((raw_created, "RBD.create"), (removed, "RBD.remove"), (second, "RBD.create (2nd)"),
                        (trash_removed, "trash_move+trash_remove"), (third, "RBD.create (3rd)"),
                        (mgr_purged, "trash_move+mgr purge")):
        _check(batch, f"c={c} raw {what}", notes)
    return {"raw_create": raw_created, "raw_remove": removed, "raw_trash_remove": trash_removed,
            "raw_trash_mgr": mgr_purged,
            "raw_cpu_create": _cpu_ms_per_op(s0, s1, len(raw_created.latencies)),
            "raw_cpu_mgr": _cpu_ms_per_op(s3, s4, len(mgr_purged.latencies)),
            "drain_raw_s": raw.wait_trash_empty(env.options.drain_timeout_s)}


def _level(env: Environment, caller: GoCaller, embedded: EmbeddedClient, raw: RawRbd, c: int,
           notes: list[str]) -> list[dict[str, Any]]:
    """`rounds` interleaved rounds at concurrency c; the side that goes first rotates (gRPC,
    in-process, raw; in-process, raw, gRPC; ...) so none always runs right after another's drain."""
    rounds = max(1, env.options.rounds)
    k = ops_per_round(env.options.ops, rounds, c)
    sides = {"driver": lambda: _calls_side(env, "driver", "driver", caller.create, caller.delete, raw, c, k, notes),
             "embedded": lambda: _calls_side(env, "embedded", "in-process", in_process(embedded.create),
                                             in_process(embedded.delete), raw, c, k, notes),
             "raw": lambda: _raw_side(env, raw, c, k, notes)}
    order = list(sides)
    out = []
    for r in range(rounds):
        one: dict[str, Any] = {}
        turn = order[r % len(order):] + order[:r % len(order)]
        for side in turn:
            one.update(sides[side]())
        one["first"] = turn[0]
        out.append(one)
    return out


def _warm_up(env: Environment, driver: DriverClient, caller: GoCaller, embedded: EmbeddedClient,
             raw: RawRbd) -> None:
    """Untimed: connect every path, fill caches, and let the first-call costs pass."""
    warm = caller.create(_names("warm-go", 0, env.options.warmup), 1).batch
    caller.delete(warm.results, 1)
    if warm.errors:
        raise RuntimeError(f"the Go gRPC caller's warm-up CreateVolume failed: {warm.errors[0]}")
    for name in _names("warm", 0, env.options.warmup):
        driver.delete(driver.create(name))
        embedded.delete(embedded.create(f"{name}-in-process"))
        raw.remove(raw.create(raw.new_name()))
    raw.wait_trash_empty(env.options.drain_timeout_s)


def count_ops(env: Environment, driver: DriverClient, raw: RawRbd, k: int) -> dict[str, Any]:
    """RADOS ops per call from the OSD's counters, one at a time (c=1), untimed: driver create,
    driver delete + the mgr's purge, raw create, raw trash_move + mgr purge (+ its purge)."""
    cluster = env.start_cluster()
    raw.wait_trash_empty(env.options.drain_timeout_s)
    c0 = osdops.read(cluster)
    created = run_batch(driver.create, _names("ops", 1, k), 1)
    time.sleep(0.5)  # the last create's lease release runs just after its answer: count it too
    c1 = osdops.read(cluster)
    deleted = run_batch(driver.delete, created.results, 1)
    raw.wait_trash_empty(env.options.drain_timeout_s)
    c2 = osdops.read(cluster)
    names = run_batch(raw.create, [raw.new_name() for _ in range(k)], 1)
    c3 = osdops.read(cluster)
    opened = run_batch(raw.open_readonly, names.results, 1)
    c3b = osdops.read(cluster)
    purged = run_batch(raw.trash_move_mgr_purge, raw.ids(names.results), 1)
    raw.wait_trash_empty(env.options.drain_timeout_s)
    c4 = osdops.read(cluster)
    counts = {"driver_create": (c1.minus(c0), len(created.latencies)),
              "driver_delete_and_purge": (c2.minus(c1), len(deleted.latencies)),
              "raw_create": (c3.minus(c2), len(names.latencies)),
              "raw_open_readonly": (c3b.minus(c3), len(opened.latencies)),
              "raw_trash_mgr_and_purge": (c4.minus(c3b), len(purged.latencies))}
    return {key: delta.per(n) for key, (delta, n) in counts.items()} | {"calls": k}


def ops_table(counts: dict[str, Any]) -> Table:
    table = Table(title=f"RADOS operations per call, counted by the OSD (c=1, {counts['calls']} calls each, untimed; "
                        "deletes include the mgr's purge, the same on both sides); op = one round trip",
                  columns=["call", "ops", "reads", "writes", "read-modify-write", "baseline", "baseline ops",
                           "extra ops"])
    for drv, base, label, base_label in (("driver_create", "raw_create", "CreateVolume", "RBD.create"),
                                         ("driver_delete_and_purge", "raw_trash_mgr_and_purge",
                                          "DeleteVolume (+ purge)", "trash_move+mgr purge (+ purge)")):
        d, b = counts.get(drv) or {}, counts.get(base) or {}
        if not d or not b:
            continue
        table.add(label, report.num(d["op"]), report.num(d["op_r"]), report.num(d["op_w"]), report.num(d["op_rw"]),
                  base_label, report.num(b["op"]), report.num(d["op"] - b["op"]))
    o = counts.get("raw_open_readonly") or {}
    if o:
        table.add("(for scale) rbd.Image read-only open + watchers_list", report.num(o["op"]), report.num(o["op_r"]),
                  report.num(o["op_w"]), report.num(o["op_rw"]), "—", "—", "—")
    return table


def _p50(batch: Batch[Any]) -> float | None:
    return percentile(batch.latencies, 50) if batch.latencies else None


def _tput(batch: Batch[Any]) -> float | None:
    return len(batch.latencies) / batch.wall_s if batch.latencies and batch.wall_s > 0 else None


def aggregate(rounds: list[dict[str, Any]], c: int) -> dict[str, Any]:
    """Pooled summaries per batch kind, and per-round ratios (driver/raw) with their spread."""
    kinds = [key for key in BATCHES if key in rounds[0]]
    paths = [(prefix, label) for prefix, label in PATHS if f"{prefix}_create" in rounds[0]]
    pooled_s: dict[str, Summary | None] = {}
    for key in kinds:
        batches = [r[key] for r in rounds]
        lat = [b.latencies for b in batches]
        errors = sum(len(b.errors) for b in batches)
        pooled_s[key] = pooled(lat, [b.wall_s for b in batches], c, errors) if any(lat) else None
    p50 = {key: [_p50(r[key]) for r in rounds] for key in kinds}
    tput = {key: [_tput(r[key]) for r in rounds] for key in kinds}
    ratios: dict[str, Spread | None] = {}
    for prefix, _ in paths:
        key_prefix = "" if prefix == "driver" else f"{prefix}_"
        ratios[f"{key_prefix}create_p50"] = ratio_spread(p50[f"{prefix}_create"], p50["raw_create"])
        ratios[f"{key_prefix}create_ops"] = ratio_spread(tput[f"{prefix}_create"], tput["raw_create"])
        ratios[f"{key_prefix}cpu_create"] = ratio_spread([r[f"{prefix}_cpu_create"] for r in rounds],
                                                         [r["raw_cpu_create"] for r in rounds])
        ratios[f"{key_prefix}cpu_delete_vs_mgr"] = ratio_spread([r[f"{prefix}_cpu_delete"] for r in rounds],
                                                                [r["raw_cpu_mgr"] for r in rounds])
        for key, _ in BASELINES:
            ratios[f"{key_prefix}delete_p50_{key}"] = ratio_spread(p50[f"{prefix}_delete"], p50[key])
            ratios[f"{key_prefix}delete_ops_{key}"] = ratio_spread(tput[f"{prefix}_delete"], tput[key])
    cpu = {f"{prefix}_cpu_{kind}": [r[f"{prefix}_cpu_{kind}"] for r in rounds]
           for prefix, _ in paths for kind in ("create", "delete")}
    cpu.update({name: [r[name] for r in rounds] for name in ("raw_cpu_create", "raw_cpu_mgr", "driver_caller_cpu_create")
                if name in rounds[0]})
    return {
        "concurrency": c,
        "rounds": len(rounds),
        "summaries": pooled_s,
        "ratios": ratios,
        "cpu_ms_per_op": {name: (spread([v for v in vals if v is not None]) if any(v is not None for v in vals)
                                 else None) for name, vals in cpu.items()},
        "drain_driver_s": [r["drain_driver_s"] for r in rounds],
        "drain_embedded_s": [r.get("drain_embedded_s", 0.0) for r in rounds],
        "drain_raw_s": [r["drain_raw_s"] for r in rounds],
        "errors": {key: [e for r in rounds for e in r[key].errors][:3] for key in kinds
                   if any(r[key].errors for r in rounds)},
    }


def _json(level: dict[str, Any]) -> dict[str, Any]:
    return {
        "concurrency": level["concurrency"],
        "rounds": level["rounds"],
        **{k: (v.to_json() if v else None) for k, v in level["summaries"].items()},
        "ratios": {k: (v.to_json() if v else None) for k, v in level["ratios"].items()},
        "cpu_ms_per_op": {k: (v.to_json() if v else None) for k, v in level["cpu_ms_per_op"].items()},
        "drain_driver_s": level["drain_driver_s"],
        "drain_embedded_s": level["drain_embedded_s"],
        "drain_raw_s": level["drain_raw_s"],
        "errors": level["errors"],
    }


def _tables(levels: list[dict[str, Any]], env: Environment, state: dict[str, str]) -> list[Table]:
    o = env.options
    k = max(1, o.ops // max(1, o.rounds))
    per_level = ", ".join(f"{ops_per_round(o.ops, o.rounds, c)} at c={c}" for c in o.concurrency
                          if ops_per_round(o.ops, o.rounds, c) != k)
    where = (f"{state['load']}; load average {state['loadavg_start']} → {state['loadavg_end']}, "
             f"all CPUs {state['cpu_busy']} busy")
    latency = Table(title=f"[{where}] latency in ms (client side, {report.mib(o.size_bytes)} MiB thin images), "
                          f"{o.rounds} interleaved rounds × {k} ops per side"
                          f"{f' ({per_level}: {WAVES} waves of the concurrency)' if per_level else ''}, "
                          "p50/p99 pooled over the rounds; "
                          "× = driver/raw, median over rounds (min–max)",
                    columns=["conc", "op", "driver p50", "driver p99", "driver ops/s", "raw baseline",
                             "raw p50", "raw p99", "raw ops/s", "p50 ×", "ops/s ×"])
    cpu = Table(title=f"[{where}] CPU ms per op, median over rounds (min–max) (driver: the cephcsi process; "
                      "in-process and raw: the bench process; gRPC caller: the Go caller process, bench/grpccaller), "
                      "× = driver/raw median (min–max); trash drain after each round",
                columns=["conc", "driver create", "raw create", "create CPU ×", "gRPC caller create", "driver delete",
                         "raw trash+mgr",
                         "delete CPU ×", "drain driver s", "drain raw s", "in-process create", "create CPU ×, in-process",
                         "in-process delete", "delete CPU ×, in-process"])

    def med(s: Spread | None) -> str:
        return "—" if s is None else f"{s.median:.2f} ({s.low:.2f}–{s.high:.2f})"

    for level in levels:
        c, s, r = level["concurrency"], level["summaries"], level["ratios"]
        dcr, ddl, rcr = s["driver_create"], s["driver_delete"], s["raw_create"]
        if dcr and rcr:
            latency.add(c, "create", report.ms(dcr.p50_s), report.ms(dcr.p99_s), report.rate(dcr.throughput),
                        "RBD.create", report.ms(rcr.p50_s), report.ms(rcr.p99_s), report.rate(rcr.throughput),
                        report.times_spread(r["create_p50"]), report.times_spread(r["create_ops"]))
        for key, base in BASELINES:
            b = s[key]
            if ddl and b:
                latency.add(c, "delete", report.ms(ddl.p50_s), report.ms(ddl.p99_s), report.rate(ddl.throughput),
                            base, report.ms(b.p50_s), report.ms(b.p99_s), report.rate(b.throughput),
                            report.times_spread(r[f"delete_p50_{key}"]), report.times_spread(r[f"delete_ops_{key}"]))
        ecr, edl, mgr = s.get("embedded_create"), s.get("embedded_delete"), s["raw_trash_mgr"]
        if ecr and rcr:
            latency.add(c, "create, in-process", report.ms(ecr.p50_s), report.ms(ecr.p99_s), report.rate(ecr.throughput),
                        "RBD.create", report.ms(rcr.p50_s), report.ms(rcr.p99_s), report.rate(rcr.throughput),
                        report.times_spread(r["embedded_create_p50"]), report.times_spread(r["embedded_create_ops"]))
        if edl and mgr:
            latency.add(c, "delete, in-process", report.ms(edl.p50_s), report.ms(edl.p99_s), report.rate(edl.throughput),
                        "trash_move+mgr purge", report.ms(mgr.p50_s), report.ms(mgr.p99_s), report.rate(mgr.throughput),
                        report.times_spread(r["embedded_delete_p50_raw_trash_mgr"]),
                        report.times_spread(r["embedded_delete_ops_raw_trash_mgr"]))
        cp = level["cpu_ms_per_op"]
        cpu.add(c, med(cp["driver_cpu_create"]), med(cp["raw_cpu_create"]), report.times_spread(r["cpu_create"]),
                med(cp.get("driver_caller_cpu_create")), med(cp["driver_cpu_delete"]), med(cp["raw_cpu_mgr"]), report.times_spread(r["cpu_delete_vs_mgr"]),
                report.num(max(level["drain_driver_s"]), 2), report.num(max(level["drain_raw_s"]), 2),
                med(cp.get("embedded_cpu_create")), report.times_spread(r.get("embedded_cpu_create")),
                med(cp.get("embedded_cpu_delete")), report.times_spread(r.get("embedded_cpu_delete_vs_mgr")))
    return [latency, cpu]


# issue 17's controller targets: (label, level, ratio key, target, at_most)
_PATH_TARGETS = (
    ("CreateVolume p50 ≤ 1.5× RBD.create, c=1", 1, "create_p50", 1.5, True),
    ("CreateVolume ops/s ≥ 0.75× RBD.create, c=32", 32, "create_ops", 0.75, False),
    ("CPU per CreateVolume ≤ 1.5× RBD.create's, c=1", 1, "cpu_create", 1.5, True),
    ("DeleteVolume p50 ≤ 1.3× trash_move+mgr purge, c=1", 1, "delete_p50_raw_trash_mgr", 1.3, True),
)
TARGETS = (*_PATH_TARGETS,
           *((f"{label}, in-process (the embedded provisioner's path)", c, f"embedded_{key}", target, at_most)
             for label, c, key, target, at_most in _PATH_TARGETS))
"""The same targets over gRPC (an external caller) and in-process (the shipped deployment's path)."""


def target_rows(passes: list[tuple[dict[str, str], list[dict[str, Any]]]]) -> Table:
    """One row per target: the median ratio (min–max) in each pass, and whether the median
    meets it ('met' / 'not met'; 'met (spread crosses)' when some round did not)."""
    table = Table(title="issue-17 targets (median over rounds; min–max in parentheses)",
                  columns=["target", *[state["load"] for state, _ in passes]])
    for label, c, key, target, at_most in TARGETS:
        cells = []
        for _, levels in passes:
            level = next((lvl for lvl in levels if lvl["concurrency"] == c), None)
            s = level["ratios"].get(key) if level else None
            cells.append(report.verdict(s, target, at_most))
        table.add(label, *cells)
    return table


@contextmanager
def _maybe_profile(env: Environment, result: SectionResult, first: bool) -> Iterator[None]:
    """With --profile: py-spy on the controller for the first pass; notes name the files."""
    if not (env.options.profile and first):
        yield
        return
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    mode = env.options.profile
    path = env.options.output_dir / f"profile-controller-{mode}-{stamp}.txt"
    with profile.recording(env.controller_pid(), path, gil=mode == "gil") as recorded:
        yield
    if recorded is not None and recorded.exists():
        summary = path.with_name(path.stem + "-top.txt")
        summary.write_text(profile.report_text(recorded))
        result.notes.append(f"profiled (py-spy, these figures are perturbed by it): {recorded} and {summary.name}")
        result.data["profile"] = str(recorded)


def run(env: Environment) -> SectionResult:
    result = SectionResult(name=NAME, title=TITLE)
    cluster = env.start_cluster()
    driver = DriverClient(env)
    pid = env.controller_pid()
    caller = GoCaller(env.controller().endpoint, cluster.parameters, cluster.secrets, env.options.size_bytes,
                      RPC_TIMEOUT_S, server_clock=lambda: procstat.cpu_seconds(pid))
    embedded = EmbeddedClient(env)
    raw = RawRbd(cluster, env.options.size_bytes)
    passes: list[tuple[dict[str, str], list[dict[str, Any]]]] = []
    try:
        _warm_up(env, driver, caller, embedded, raw)
        try:
            op_counts = count_ops(env, driver, raw, min(20, env.options.ops))
        except Exception as error:  # noqa: BLE001 - a figure missing, not a failed section
            op_counts = {}
            result.notes.append(f"RADOS op counts not measured: {type(error).__name__}: {str(error)[:200]}")
        env.sample_controller("after warm-up (connected, idle)")
        for hogs, state in background.passes(env.options.background_loads):
            levels = []
            with _maybe_profile(env, result, first=not passes):
                for c in env.options.concurrency:
                    log.info("controller [%s]: concurrency %d, %d rounds × %d ops", state["load"], c,
                             env.options.rounds, ops_per_round(env.options.ops, env.options.rounds, c))
                    levels.append(aggregate(_level(env, caller, embedded, raw, c, result.notes), c))
            passes.append((state, levels))
        env.sample_controller("after the create/delete batches (idle)")
        leftovers = [name for name in raw.images() if name.startswith(("bench-", "csi-vol-"))]
        if leftovers:
            result.notes.append(f"{len(leftovers)} images left in the pool after the section (e.g. {leftovers[0]})")
    finally:
        embedded.close()
        raw.close()

    for state, levels in passes:
        result.tables.extend(_tables(levels, env, state))
    result.tables.append(target_rows(passes))
    if op_counts:
        result.tables.append(ops_table(op_counts))
        result.data["rados_ops_per_call"] = op_counts
    result.data.update({"size_bytes": env.options.size_bytes, "ops": env.options.ops, "rounds": env.options.rounds,
                        "passes": [{"state": state, "levels": [_json(lvl) for lvl in levels]}
                                   for state, levels in passes]})
    result.notes.extend([
        "Fair delete baseline: trash_move+mgr purge is the same Ceph work the driver's DeleteVolume does before it "
        "answers (the purge is left to the mgr); RBD.remove and trash_move+trash_remove are what a synchronous "
        "delete would cost (O(objects)).",
        "What each call costs in RADOS operations and CPU, and why: bench/README.md ('What each call costs').",
        "in-process: the same ControllerServicer calls the embedded provisioner makes inside `cephcsi "
        "--mode=controller` (context=None: validation, logging, metrics and storage code as over gRPC, no gRPC hop), "
        "run in the bench process, with the claim owner keys deploy/'s --extra-create-metadata adds (written to the "
        "new image as metadata); over gRPC is what an external caller without that flag (csi-provisioner's default, "
        "csi-sanity) pays, called from Go (bench/grpccaller, grpc-go and the CSI spec's Go stubs) as those callers "
        "are, one channel and a goroutine per call in flight.",
    ])
    # Later sections read the first pass (quiet unless only loaded passes ran) and the RPC count.
    first = passes[0][1] if passes else []
    env.shared["controller_levels"] = [_json(lvl) for lvl in first]
    env.shared["controller_rpcs"] = sum(
        (s.count if s else 0)
        for _, levels in passes for lvl in levels for key, s in lvl["summaries"].items() if key.startswith("driver_"))
    return result


SECTION = Section(NAME, TITLE, run)
