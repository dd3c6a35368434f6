"""Section 1: CreateVolume/DeleteVolume through the gRPC socket of a real
`cephcsi --mode=controller --sidecars=none`, beside raw python-rbd at the same concurrency on
the same cluster in the same run.

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
"""
from __future__ import annotations

import logging
import uuid
from typing import Any

from bench import procstat, report
from bench.environment import Environment
from bench.load import Batch, run_batch
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from bench.stats import Summary, ratio
from cephcsi._generated import csi_pb2

log = logging.getLogger("bench")

NAME = "controller"
TITLE = "1. CreateVolume/DeleteVolume: driver over gRPC vs raw python-rbd"
RPC_TIMEOUT_S = 120.0
Mode = csi_pb2.VolumeCapability.AccessMode


def _create_request(env: Environment, name: str) -> csi_pb2.CreateVolumeRequest:
    cluster = env.start_cluster()
    return csi_pb2.CreateVolumeRequest(
        name=name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=env.options.size_bytes),
        volume_capabilities=[csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))],
        parameters=cluster.parameters,
        secrets=cluster.secrets,
    )


class DriverClient:
    def __init__(self, env: Environment) -> None:
        self.env = env
        self.stub = env.controller().controller
        self.secrets = env.start_cluster().secrets

    def create(self, name: str) -> str:
        reply = self.stub.CreateVolume(_create_request(self.env, name), timeout=RPC_TIMEOUT_S)
        return str(reply.volume.volume_id)

    def delete(self, volume_id: str) -> None:
        self.stub.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=self.secrets),
                               timeout=RPC_TIMEOUT_S)


def _names(kind: str, concurrency: int, count: int) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"bench-{kind}-c{concurrency}-{run}-{i}" for i in range(count)]


def _cpu_ms_per_op(before: float, after: float, ops: int) -> float | None:
    return (after - before) * 1000 / ops if ops else None


def _check(batch: Batch[Any], what: str, notes: list[str]) -> None:
    if batch.errors:
        notes.append(f"{what}: {len(batch.errors)} of {len(batch.errors) + len(batch.latencies)} failed; "
                     f"first: {batch.errors[0]}")


def _level(env: Environment, driver: DriverClient, raw: RawRbd, c: int, notes: list[str]) -> dict[str, Any]:
    n = env.options.ops
    pid = env.controller_pid()
    out: dict[str, Any] = {"concurrency": c}

    # Driver: create N, delete them, wait for the mgr to purge.
    cpu0 = procstat.sample(pid).cpu_s
    created = run_batch(driver.create, _names("drv", c, n), c)
    cpu1 = procstat.sample(pid).cpu_s
    deleted = run_batch(driver.delete, created.results, c)
    cpu2 = procstat.sample(pid).cpu_s
    _check(created, f"c={c} driver CreateVolume", notes)
    _check(deleted, f"c={c} driver DeleteVolume", notes)
    out["drain_after_driver_delete_s"] = raw.wait_trash_empty(env.options.drain_timeout_s)
    out["driver_create"], out["driver_delete"] = created, deleted
    out["driver_cpu_ms_per_op"] = {"create": _cpu_ms_per_op(cpu0, cpu1, len(created.latencies)),
                                   "delete": _cpu_ms_per_op(cpu1, cpu2, len(deleted.latencies))}

    # Raw: create + remove; create + trash_move/trash_remove; create + trash_move/mgr purge.
    s0 = procstat.self_cpu_seconds()
    raw_created = run_batch(raw.create, [raw.new_name() for _ in range(n)], c)
    s1 = procstat.self_cpu_seconds()
    removed = run_batch(raw.remove, raw_created.results, c)
    s2 = procstat.self_cpu_seconds()
    second = run_batch(raw.create, [raw.new_name() for _ in range(n)], c)
    trash_removed = run_batch(raw.trash_move_remove, raw.ids(second.results), c)
    third = run_batch(raw.create, [raw.new_name() for _ in range(n)], c)
    s3 = procstat.self_cpu_seconds()
    mgr_purged = run_batch(raw.trash_move_mgr_purge, raw.ids(third.results), c)
    s4 = procstat.self_cpu_seconds()
    out["drain_after_raw_mgr_purge_s"] = raw.wait_trash_empty(env.options.drain_timeout_s)
    for batch, what in ((raw_created, "RBD.create"), (removed, "RBD.remove"), (second, "RBD.create (2nd)"),
                        (trash_removed, "trash_move+trash_remove"), (third, "RBD.create (3rd)"),
                        (mgr_purged, "trash_move+mgr purge")):
        _check(batch, f"c={c} raw {what}", notes)
    out["raw_create"], out["raw_remove"] = raw_created, removed
    out["raw_trash_remove"], out["raw_trash_mgr"] = trash_removed, mgr_purged
    out["raw_cpu_ms_per_op"] = {"create": _cpu_ms_per_op(s0, s1, len(raw_created.latencies)),
                                "remove": _cpu_ms_per_op(s1, s2, len(removed.latencies)),
                                "trash_move+mgr purge": _cpu_ms_per_op(s3, s4, len(mgr_purged.latencies))}
    return out


def _warm_up(env: Environment, driver: DriverClient, raw: RawRbd) -> None:
    """Untimed: connect both paths, fill caches, and let the first-call costs pass."""
    for name in _names("warm", 0, env.options.warmup):
        driver.delete(driver.create(name))
        raw.remove(raw.create(raw.new_name()))
    raw.wait_trash_empty(env.options.drain_timeout_s)


def _pair_row(table: Table, c: int, op: str, drv: Summary, base: str, raw: Summary) -> None:
    table.add(c, op, report.ms(drv.p50_s), report.ms(drv.p99_s), report.rate(drv.throughput), base,
              report.ms(raw.p50_s), report.ms(raw.p99_s), report.rate(raw.throughput),
              report.times(ratio(drv.p50_s, raw.p50_s)), report.times(ratio(drv.p99_s, raw.p99_s)),
              report.times(ratio(drv.throughput, raw.throughput)))


def _summary(batch: Batch[Any]) -> Summary | None:
    return batch.summary() if batch.latencies else None


def run(env: Environment) -> SectionResult:
    result = SectionResult(name=NAME, title=TITLE)
    cluster = env.start_cluster()
    driver = DriverClient(env)
    raw = RawRbd(cluster, env.options.size_bytes)
    try:
        _warm_up(env, driver, raw)
        env.sample_controller("after warm-up (connected, idle)")
        levels = []
        for c in env.options.concurrency:
            log.info("controller: concurrency %d, %d ops per batch", c, env.options.ops)
            levels.append(_level(env, driver, raw, c, result.notes))
        env.sample_controller("after the create/delete batches (idle)")
        leftovers = [name for name in raw.images() if name.startswith(("bench-", "csi-vol-"))]
        if leftovers:
            result.notes.append(f"{len(leftovers)} images left in the pool after the section (e.g. {leftovers[0]})")
    finally:
        raw.close()

    latency = Table(title=f"latency in ms (client side, {report.mib(env.options.size_bytes)} MiB thin images, "
                          f"{env.options.ops} ops per batch); × = driver/raw",
                    columns=["conc", "op", "driver p50", "driver p99", "driver ops/s", "raw baseline",
                             "raw p50", "raw p99", "raw ops/s", "p50 ×", "p99 ×", "ops/s ×"])
    cpu = Table(title="CPU ms per op (driver: the cephcsi process; raw: the bench process) and mgr purge drain",
                columns=["conc", "driver create", "raw create", "driver delete", "raw remove",
                         "raw trash+mgr", "drain after driver delete s", "drain after raw mgr purge s"])
    data_levels = []
    for level in levels:
        c = level["concurrency"]
        s = {k: _summary(level[k]) for k in ("driver_create", "driver_delete", "raw_create", "raw_remove",
                                             "raw_trash_remove", "raw_trash_mgr")}
        dcr, ddl, rcr = s["driver_create"], s["driver_delete"], s["raw_create"]
        if dcr and rcr:
            _pair_row(latency, c, "create", dcr, "RBD.create", rcr)
        for key, base in (("raw_remove", "RBD.remove"), ("raw_trash_remove", "trash_move+trash_remove"),
                          ("raw_trash_mgr", "trash_move+mgr purge")):
            baseline = s[key]
            if ddl and baseline:
                _pair_row(latency, c, "delete", ddl, base, baseline)
        dc, rc = level["driver_cpu_ms_per_op"], level["raw_cpu_ms_per_op"]
        cpu.add(c, report.num(dc["create"], 2), report.num(rc["create"], 2), report.num(dc["delete"], 2),
                report.num(rc["remove"], 2), report.num(rc["trash_move+mgr purge"], 2),
                report.num(level["drain_after_driver_delete_s"], 2), report.num(level["drain_after_raw_mgr_purge_s"], 2))
        data_levels.append({
            "concurrency": c,
            **{k: (v.to_json() if v else None) for k, v in s.items()},
            "driver_cpu_ms_per_op": dc,
            "raw_cpu_ms_per_op": rc,
            "drain_after_driver_delete_s": level["drain_after_driver_delete_s"],
            "drain_after_raw_mgr_purge_s": level["drain_after_raw_mgr_purge_s"],
            "errors": {k: level[k].errors[:3] for k in ("driver_create", "driver_delete", "raw_create",
                                                        "raw_remove", "raw_trash_remove", "raw_trash_mgr")
                       if level[k].errors},
        })
    result.tables = [latency, cpu]
    result.data = {"size_bytes": env.options.size_bytes, "ops": env.options.ops, "levels": data_levels}
    result.notes.extend([
        "Fair delete baseline: trash_move+mgr purge is the same Ceph work the driver's DeleteVolume does before it "
        "answers (the purge is left to the mgr); RBD.remove and trash_move+trash_remove are what a synchronous "
        "delete would cost (O(objects)).",
        "The driver adds per call: journal omap reads/writes (4 on create, 3 on delete), an image open to read "
        "the id (create) and two read-only opens (existence + watcher check, delete), a pool ioctx open, and gRPC.",
    ])
    env.shared["controller_levels"] = data_levels
    return result


SECTION = Section(NAME, TITLE, run)
