"""Section 4a: PVC → Bound through the embedded provisioner, on a real etcd + kube-apiserver +
kube-controller-manager (its PV binder and protection controllers) and the real Ceph cluster,
with one `cephcsi --mode=controller` (leader election on, production defaults, --log-level=info).

Measured: 1 PVC create → Bound (repeated, p50), a burst of N PVCs created at once (8 threads)
→ all PVs created and all Bound (PVC/s, per-PVC p50/p99), then all deleted → PVs gone, images
gone, trash purged; the controller's VmRSS/VmHWM/CPU before, during (sampled every 0.1 s) and
after the burst; its /metrics (API requests, client rate-limiter waits, provisioning time).

Floors, each measured in the same run beside it:
- Ceph: N `RBD().create` of the same size on the same cluster (bench/raw.py, 8 threads);
- apiserver: creating N PVCs + N PVs by hand through a client with the controller's own
  QPS/burst defaults (cephcsi.kube.client, 8 threads) — the least API writing a provisioned claim
  needs;
- kcm: those claims (no class) each followed at once by a PV bound to it (claimRef with uid, as a
  provisioner writes it) → all Bound: a provisioner that costs nothing, leaving
  kube-controller-manager's PV binder (its client runs at QPS 20 / burst 30 by default) — the
  part of PVC → Bound no provisioner can make faster. (It skips one kcm write per claim that the
  real path has: the storage-provisioner annotation.)
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bench import kube_floors, kubestats, procstat, report
from bench.environment import Environment
from bench.kube import (
    SECRET,
    Claims,
    KubeSetup,
    controller_defaults,
    delete_claims,
    images_with,
    event_writes,
    log_problems,
    metrics,
    size_text,
    timed_calls,
    wait_until,
)
from bench.kubestats import Burst, metric_sum
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from bench.stats import ratio

log = logging.getLogger("bench")

NAME = "kube-provisioning"
TITLE = "4a. Kubernetes: PVC → Bound (embedded provisioner) vs Ceph / apiserver / kcm floors"


def _burst_row(table: Table, what: str, b: Burst | None, note: str = "", sequential: bool = False) -> None:
    """One row; `sequential` rows (one claim at a time) have no all-done time or rate."""
    if b is None:
        table.add(what, "—", "—", "—", "—", "—", "—", note)
        return
    done = f"{b.reached}/{b.count}" if b.reached < b.count else str(b.count)
    all_s, rate = ("—", "—") if sequential else (report.num(b.all_s, 2), report.rate(b.per_second))
    table.add(what, done, all_s, rate, report.ms(b.p50_s), report.ms(b.p99_s), report.ms(b.max_s), note)


def _single(setup: KubeSetup, claims: Claims, storage_class: str, size: str, repeats: int,
            prefix: str) -> tuple[Burst, Burst, list[str]]:
    """Create → Bound of one claim at a time; (to Bound, to PV created, names)."""
    started: dict[str, float] = {}
    names = []
    for i in range(repeats):
        name = f"{prefix}{i}"
        names.append(name)
        started[name] = time.monotonic()
        setup.kube.create_pvc(claims.namespace, name, storage_class, size)
        claims.pvcs.wait("bound", [name], 60)
    return (kubestats.burst(started, claims.pvcs.first("bound")),
            kubestats.burst(started, claims.pvs.first("created")), names)


def _go_stack(env: Environment) -> dict[str, Any] | None:
    """Section 3b's figures from this run: Go provisioner + attacher at rest and the driver alone."""
    # Section 3b's result dict (env.shared holds each section's figures untyped).
    go: dict[str, Any] | None = env.shared.get("go_sidecars")
    if not go or not go.get("go_controller_side_sum", {}).get("measured"):
        return None
    return go


@dataclass
class Measured:
    """What the controller did in this section (phases 1–3), for the tables and notes."""

    one_bound: Burst
    one_pv: Burst
    burst_bound: Burst
    burst_pv: Burst
    stages: list[kubestats.Stage]
    gone: Any
    """delete_claims' result for the burst."""
    create_errors: list[str]
    missing: list[str]
    samples: dict[str, procstat.ProcessSample] = field(default_factory=dict)
    before: procstat.ProcessSample | None = None
    peak: procstat.ProcessSample | None = None


Samples = list[tuple[str, dict[str, str], float]]


def _metric_delta(m0: Samples, m1: Samples, name: str, /, **labels: str) -> float:
    return metric_sum(m1, name, **labels) - metric_sum(m0, name, **labels)


def _burst_metrics(m0: Samples, m1: Samples, defaults: Any) -> dict[str, Any]:
    """The controller's /metrics over the burst: API requests, limiter waits, provisioning."""
    requests = _metric_delta(m0, m1, "rest_client_requests_total")
    prov = {"operation": "provision", "outcome": "success"}
    prov_ok = _metric_delta(m0, m1, "cephcsi_sidecar_operation_seconds_count", **prov)
    prov_sum = _metric_delta(m0, m1, "cephcsi_sidecar_operation_seconds_sum", **prov)
    return {
        "api_requests": requests,
        "limiter_wait_sum_s": _metric_delta(m0, m1, "rest_client_rate_limiter_duration_seconds_sum"),
        "limiter_floor_s": kubestats.limiter_floor_s(requests, defaults.kube_api_qps, defaults.kube_api_burst),
        "provision_ok": prov_ok, "provision_mean_s": prov_sum / prov_ok if prov_ok else None,
        "provision_failed": _metric_delta(m0, m1, "controller_persistentvolumeclaim_provision_failed_total"),
        "workqueue_retries": _metric_delta(m0, m1, "workqueue_retries_total"),
    }


def _burst_log_evidence(burst_log: list[str], problems: list[str]) -> dict[str, Any]:
    """What the controller's log says of the burst: provisions, second passes, warnings."""
    adopted_lines = [line for line in burst_log if "adopted an existing PV" in line]
    # Evidence for a second pass over a claim: every log line naming the adopted PVs.
    adopted_pvs = [part[3:] for line in adopted_lines[:3] for part in line.split() if part.startswith("pv=")]
    return {
        "log_volume_provisioned": sum(1 for line in burst_log if "volume provisioned" in line),
        "log_adopted_existing_pv": len(adopted_lines),
        "adopted_log": [line for line in burst_log if any(pv in line for pv in adopted_pvs)][:40],
        "log_problems": len(problems), "log_problem_samples": problems[:5],
    }


def _burst_objects(setup: KubeSetup, cluster: Any, raw: RawRbd, namespace: str, prefix: str,
                   started: Mapping[str, float]) -> dict[str, Any]:
    """Count what the burst left: PVs, images, journal entries (one of each per claim)."""
    from tests.integration.sidecars.harness import journal_names

    claim_docs = [c for c in setup.kube.pvcs(namespace) if c["metadata"]["name"] in started]
    uids = {f"pvc-{c['metadata']['uid']}" for c in claim_docs}
    pvs = setup.kube.pvs_of(namespace)
    images = images_with(raw, prefix)
    return {
        "pvs": len(pvs), "images": len(images),
        "journal_entries": len([k for k in journal_names(cluster) if k in uids]),
        "distinct_image_names": len(set(images)),
        "pv_image_names": len({(pv["spec"].get("csi") or {}).get("volumeAttributes", {}).get("imageName")
                               for pv in pvs}),
    }


def _run_burst(setup: KubeSetup, controller: Any, claims: Claims, *, cluster: Any, raw: RawRbd, n: int,
               storage_class: str, size: str, prefix: str, data: dict[str, Any],
               measured_samples: dict[str, procstat.ProcessSample]) -> tuple[Burst, Burst, list[kubestats.Stage],
                                                                             dict[str, float], list[str], list[str],
                                                                             procstat.ProcessSample]:
    """Phase 2: N claims at once → all Bound; fills data["burst_run"]."""
    namespace = claims.namespace
    pid = controller.process.pid
    m0 = metrics(controller)
    problems0 = len(log_problems(controller))
    log_mark = len(controller.log())
    sampler = procstat.Sampler(pid).start()
    names = [f"burst-{i:03d}" for i in range(n)]
    started, create_errors, create_wall = timed_calls(
        lambda c: setup.kube.create_pvc(namespace, c, storage_class, size), names)
    missing = claims.pvcs.wait("bound", list(started), max(120.0, 3.0 * n))
    peak = sampler.stop()
    measured_samples["all Bound (after the burst)"] = procstat.sample(pid)
    measured_samples["peak during the burst (0.1 s samples)"] = peak
    m1 = metrics(controller)
    burst_bound = kubestats.burst(started, claims.pvcs.first("bound"))
    burst_pv = kubestats.burst(started, claims.pvs.first("created"))
    stages = kube_floors.stages(claims, started)
    data["burst_run"] = {
        "events": event_writes(setup, namespace, started),
        "created": len(started), "create_errors": create_errors, "create_wall_s": create_wall,
        "bound": burst_bound.to_json(), "pv_created": burst_pv.to_json(), "missing": missing,
        "stages": [st.to_json() for st in stages],
        **_burst_objects(setup, cluster, raw, namespace, prefix, started),
        **_burst_metrics(m0, m1, controller_defaults()),
        **_burst_log_evidence(controller.log()[log_mark:].splitlines(), log_problems(controller)[problems0:]),
    }
    return burst_bound, burst_pv, stages, started, create_errors, missing, peak


def _measure_controller(env: Environment, setup: KubeSetup, raw: RawRbd, *, n: int, repeats: int, size: str,
                        prefix: str, data: dict[str, Any]) -> Measured:
    """Phases 1–3 with one leader: single claims, the burst, then deleting it all."""
    cluster = env.start_cluster()
    namespace = setup.namespace("bench-4a")
    lease_namespace = setup.namespace("bench-le")
    storage_class = setup.kube.create_storage_class(cluster, SECRET, prefix=prefix)
    samples: dict[str, procstat.ProcessSample] = {}
    claims: Claims | None = None
    try:
        (controller,) = setup.start_controllers(env, 1, lease_namespace)
        assert controller.process is not None
        pid = controller.process.pid
        samples["started (serving)"] = procstat.sample(pid)
        lead_s = wait_until(controller.is_leader, 60)
        ready_s = wait_until(lambda: controller.http("/readyz")[0] == 200, 60)
        data["leader_after_s"], data["ready_after_s"] = lead_s, ready_s
        if lead_s is None:
            raise RuntimeError(f"the controller never took the Lease:\n{controller.log()[-2000:]}")
        claims = Claims(setup, namespace)

        # 1. One PVC at a time.
        one_bound, one_pv, single_names = _single(setup, claims, storage_class, size, repeats, "one-")
        data["single"] = {"bound": one_bound.to_json(), "pv_created": one_pv.to_json()}
        data["single_delete"] = delete_claims(setup, claims, single_names, raw, prefix, 120).to_json()
        time.sleep(1)
        samples["idle leader (before the burst)"] = before = procstat.sample(pid)

        # 2. The burst.
        burst_bound, burst_pv, stages, started, create_errors, missing, peak = _run_burst(
            setup, controller, claims, cluster=cluster, raw=raw, n=n, storage_class=storage_class, size=size,
            prefix=prefix, data=data, measured_samples=samples)
        after = samples["all Bound (after the burst)"]

        # 3. Delete everything.
        cpu_before_delete = procstat.sample(pid).cpu_s
        gone = delete_claims(setup, claims, list(started), raw, prefix, max(120.0, 3.0 * n))
        data["burst_delete"] = gone.to_json()
        samples["after deleting the burst (idle)"] = after_delete = procstat.sample(pid)
        data["cpu"] = {"provision_s": after.cpu_s - before.cpu_s,
                       "provision_ms_per_pvc": (after.cpu_s - before.cpu_s) * 1000 / n,
                       "delete_s": after_delete.cpu_s - cpu_before_delete,
                       "delete_ms_per_pvc": (after_delete.cpu_s - cpu_before_delete) * 1000 / n}
        data["controller_log_problems_total"] = len(log_problems(controller))
    finally:
        if claims is not None:
            claims.stop()
        setup.stop_controllers()
    return Measured(one_bound=one_bound, one_pv=one_pv, burst_bound=burst_bound, burst_pv=burst_pv, stages=stages,
                    gone=gone, create_errors=create_errors, missing=missing, samples=samples, before=before,
                    peak=peak)


def _measure_floors(setup: KubeSetup, raw: RawRbd, *, n: int, repeats: int, size: str,
                    data: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Phase 4 (our controller stopped, the trash drained): the kcm/apiserver and Ceph floors."""
    kube_floor = kube_floors.kube_floor(setup, n, repeats, size)
    raw_floor = kube_floors.raw_floor(raw, n)
    data["floor_kube"] = {k: (v.to_json() if isinstance(v, Burst) else v) for k, v in kube_floor.items()
                          if k != "zero_stages"}
    data["floor_kube"]["zero_stages"] = [st.to_json() for st in kube_floor["zero_stages"]]
    raw_summary = raw_floor["batch"].summary()
    data["floor_ceph"] = {**raw_summary.to_json(), "cpu_s": raw_floor["cpu_s"], "threads": kube_floors.RAW_THREADS,
                          "errors": raw_floor["batch"].errors}
    return kube_floor, raw_summary


def _latency_table(env: Environment, m: Measured, kube_floor: Mapping[str, Any], raw_summary: Any, n: int,
                   size: str) -> Table:
    defaults = controller_defaults()
    latency = Table(title=f"PVC → Bound, {size} PVCs (thin); per-PVC latency from its create call; "
                          f"burst = {n} PVCs created by 8 threads",
                    columns=["what", "PVCs", "all done s", "PVC/s", "p50 ms", "p99 ms", "max ms", "note"])
    _burst_row(latency, "1 PVC: create → PV created (provisioner)", m.one_pv, "one at a time", True)
    _burst_row(latency, "1 PVC: create → Bound", m.one_bound, "one at a time", True)
    _burst_row(latency, "floor kcm: 1 PVC, zero-cost provisioner → Bound", kube_floor["zero_single"],
               "one at a time", True)
    _burst_row(latency, "burst: create → all PVs created", m.burst_pv, "the provisioner's part")
    _burst_row(latency, "burst: create → all Bound", m.burst_bound, "")
    _burst_row(latency, f"floor kcm: {n} PVCs, zero-cost provisioner → all Bound", kube_floor["zero_burst"],
               "kcm annotates, we write each PV at once")
    _burst_row(latency, f"floor kcm: {n} PVCs + PVs by hand → all Bound", kube_floor["byhand_burst"],
               "no class: kcm's binder alone")
    wall = kube_floor["byhand_create_wall_s"]
    latency.add(f"floor apiserver: create {n} PVCs + {n} PVs", str(n), report.num(wall, 2), report.rate(n / wall),
                "—", "—", "—", f"client QPS {defaults.kube_api_qps:g}/burst {defaults.kube_api_burst} (ours), 8 threads")
    latency.add(f"floor Ceph: {n} RBD.create", str(raw_summary.count), report.num(raw_summary.wall_s, 2),
                report.rate(raw_summary.throughput), report.ms(raw_summary.p50_s), report.ms(raw_summary.p99_s),
                report.ms(raw_summary.max_s), f"python-rbd, {kube_floors.RAW_THREADS} threads, same size")
    levels = env.shared.get("controller_levels") or []
    c1 = next((lvl for lvl in levels if lvl.get("concurrency") == 1), None)
    if c1 and c1.get("driver_create"):
        drv = c1["driver_create"]
        latency.add("direct CreateVolume over gRPC, c=1 (section 1)", str(drv["count"]), "—", "—",
                    report.ms(drv["p50_s"]), report.ms(drv["p99_s"]), report.ms(drv["max_s"]),
                    "the driver call inside each provisioning")
    _burst_row(latency, "delete burst: PVC delete → PV gone", m.gone.pv_gone,
               f"images gone after {report.num(m.gone.images_gone_s, 2)} s, trash purged after "
               f"{report.num(m.gone.trash_empty_s, 2)} s")
    return latency


def _floors_of(kube_floor: Mapping[str, Any], raw_summary: Any, limiter_floor_s: float) -> list[tuple[str, Any]]:
    return [("Ceph: RBD.create ×N", raw_summary.wall_s),
            ("apiserver: N PVCs + N PVs created (our QPS/burst)", kube_floor["byhand_create_wall_s"]),
            ("kcm binder alone: N PVCs + PVs by hand → all Bound", kube_floor["byhand_burst"].all_s),
            ("kcm + zero-cost provisioner → all Bound", kube_floor["zero_burst"].all_s),
            ("our client limiter: (requests − burst) / QPS", limiter_floor_s)]


def _ratio_table(m: Measured, floors: list[tuple[str, Any]]) -> Table:
    ratios = Table(title="the burst against its floors (× = burst / floor, wall time of all N)",
                   columns=["floor", "floor s", "burst → all Bound s", "×", "burst → all PVs s", "×"])
    for label, seconds in floors:
        ratios.add(label, report.num(seconds, 2), report.num(m.burst_bound.all_s, 2),
                   report.times(_ratio(m.burst_bound.all_s, seconds)), report.num(m.burst_pv.all_s, 2),
                   report.times(_ratio(m.burst_pv.all_s, seconds)))
    return ratios


def _stage_table(m: Measured, kube_floor: Mapping[str, Any], n: int) -> Table:
    stage_table = Table(title=f"where the time goes in the {n}-PVC burst: each claim's stages (p50/p99 per claim; "
                              "'last' = from the first create until the last claim got there)",
                        columns=["stage", "who", "ours p50 ms", "ours p99 ms", "ours last s", "zero-cost p50 ms",
                                 "zero-cost p99 ms", "zero-cost last s"])
    who = {"annotated": "kcm", "PV created": "provisioner", "Bound": "kcm"}
    for ours, zero in zip(m.stages, kube_floor["zero_stages"]):
        stage_table.add(ours.name, who.get(ours.name.split("→ ")[-1], ""), report.ms(ours.per_object.p50_s),
                        report.ms(ours.per_object.p99_s), report.num(ours.last_s, 2), report.ms(zero.per_object.p50_s),
                        report.ms(zero.per_object.p99_s), report.num(zero.last_s, 2))
    return stage_table


def _memory_table(m: Measured, cpu: Mapping[str, float], n: int) -> Table:
    mem = Table(title="controller process (driver + provisioner + attacher + leader election)",
                columns=["state", "VmRSS MiB", "VmHWM MiB", "CPU s (cumulative)", "threads"])
    for label, s in m.samples.items():
        mem.add(label, report.mib(s.rss_bytes), report.mib(s.hwm_bytes), report.num(s.cpu_s, 2), s.threads)
    mem.add(f"CPU per PVC: provision (burst of {n})", "", "", f"{cpu['provision_ms_per_pvc']:.1f} ms", "")
    mem.add(f"CPU per PVC: delete (burst of {n})", "", "", f"{cpu['delete_ms_per_pvc']:.1f} ms", "")
    return mem


def _footprint_table(env: Environment, m: Measured, n: int, data: dict[str, Any]) -> Table:
    assert m.before is not None and m.peak is not None
    footprint = Table(title="whole controller-side footprint: one Python process vs the Go sidecar stack",
                      columns=["stack", "processes", "VmRSS MiB", "VmHWM MiB", "note"])
    ours_idle, ours_peak = m.before, m.peak
    footprint.add("cephcsi (embedded loops)", "1", report.mib(ours_idle.rss_bytes), report.mib(ours_idle.hwm_bytes),
                  "idle leader, caches synced, before the burst")
    footprint.add("cephcsi (embedded loops)", "1", report.mib(ours_peak.rss_bytes), report.mib(ours_peak.hwm_bytes),
                  f"peak during the {n}-PVC burst")
    go = _go_stack(env)
    if not go:
        footprint.add("Go sidecars + driver", "—", "—", "—", "not measured in this run (run section `sidecars` first)")
        return footprint
    go_sum = go["go_controller_side_sum"]
    driver = go["controller"]
    total_rss = go_sum["rss_bytes"] + driver["rss_bytes"]
    total_hwm = go_sum["hwm_bytes"] + driver["hwm_bytes"]
    footprint.add(" + ".join(go_sum["measured"]) + " (Go, at rest)", str(len(go_sum["measured"])),
                  report.mib(go_sum["rss_bytes"]), report.mib(go_sum["hwm_bytes"]), "section 3b, this run")
    footprint.add("+ driver alone (cephcsi --sidecars=none)", "1", report.mib(driver["rss_bytes"]),
                  report.mib(driver["hwm_bytes"]),
                  "section 3b: after section 1's batches" if "after the create/delete batches (idle)" in env.controller_samples
                  else "section 3b: idle, section 1 did not run (no batches)")
    footprint.add("= Go sidecars + driver", str(len(go_sum["measured"]) + 1), report.mib(total_rss),
                  report.mib(total_hwm), "")
    warm = env.controller_samples.get("after warm-up (connected, idle)")
    if warm is not None:
        fresh = go_sum["rss_bytes"] + warm.rss_bytes
        footprint.add("= Go sidecars + driver just warmed up", str(len(go_sum["measured"]) + 1),
                      report.mib(fresh), "", "driver row of 3a before section 1's batches")
        data["go_stack_fresh_driver_rss_bytes"] = fresh
    footprint.add("ratio cephcsi idle / Go stack", "", report.times(ours_idle.rss_bytes / total_rss), "", "")
    footprint.add("ratio cephcsi burst peak / Go stack (at rest)", "", report.times(ours_peak.rss_bytes / total_rss),
                  report.times(ours_peak.hwm_bytes / total_hwm), "Go stack not loaded: its peak would be higher")
    data["go_stack"] = {"rss_bytes": total_rss, "hwm_bytes": total_hwm}
    return footprint


def _notes(m: Measured, run_data: Mapping[str, Any], kube_floor: Mapping[str, Any],
           floors: list[tuple[str, Any]], n: int) -> list[str]:
    defaults = controller_defaults()
    notes = [
        f"Burst check: {run_data['created']} PVCs created, {m.burst_bound.reached} Bound, {run_data['pvs']} PVs, "
        f"{run_data['images']} images with the class prefix ({run_data['distinct_image_names']} distinct, "
        f"{run_data['pv_image_names']} distinct in the PVs), {run_data['journal_entries']} journal entries; "
        f"provisioned OK {run_data['provision_ok']:.0f} (mean {report.ms(run_data['provision_mean_s'])} ms from "
        f"the annotated claim to the PV), failed attempts {run_data['provision_failed']:.0f}, work-queue retries "
        f"{run_data['workqueue_retries']:.0f}, 'adopted an existing PV' (a second pass over an already provisioned "
        f"claim) {run_data['log_adopted_existing_pv']}, controller log lines at WARNING+ during the burst: "
        f"{run_data['log_problems']}.",
        f"Controller API traffic during the burst: {run_data['api_requests']:.0f} requests "
        f"({run_data['api_requests'] / n:.1f} per PVC), {run_data['limiter_wait_sum_s']:.1f} s waited in its client "
        f"rate limiter in total (QPS {defaults.kube_api_qps:g}/burst {defaults.kube_api_burst}: the limiter alone "
        f"needs ≥ {run_data['limiter_floor_s']:.1f} s for that many requests)."]
    dominant = max(((label, s) for label, s in floors if s), key=lambda x: x[1], default=None)
    if dominant:
        notes.append(f"Largest floor: {dominant[0]} ({dominant[1]:.2f} s of the burst's "
                     f"{report.num(m.burst_bound.all_s, 2)} s to all Bound).")
    kcm_ours = run_data["events"].get("persistentvolume-controller/ExternalProvisioning", {})
    kcm_zero = kube_floor["zero_events"].get("persistentvolume-controller/ExternalProvisioning", {})
    if kcm_ours or kcm_zero:
        notes.append(
            f"kcm's 'ExternalProvisioning' event writes (it writes one per sync of a claim waiting for an external "
            f"provisioner, from its QPS 20/burst 30 client): {kcm_ours.get('writes', 0)} for our {n} claims vs "
            f"{kcm_zero.get('writes', 0)} with the zero-cost provisioner.")
    if kube_floor["errors"]:
        notes.append(f"floor errors: {'; '.join(kube_floor['errors'][:3])}")
    if m.gone.pvs_left or m.gone.images_left:
        notes.append(f"NOT cleaned up: {len(m.gone.pvs_left)} PVs, {len(m.gone.images_left)} images left")
    if m.create_errors or m.missing:
        notes.append(f"problems: {len(m.create_errors)} create errors, {len(m.missing)} claims not Bound in time")
    if run_data["log_problem_samples"]:
        notes.append("first controller warnings: " + " | ".join(x[:160] for x in run_data["log_problem_samples"][:3]))
    return notes


def run(env: Environment) -> SectionResult:
    """Measure (controller phases, then floors), then tabulate."""
    opts = env.options
    n, repeats = opts.pvc_burst, opts.pvc_repeats
    setup: KubeSetup = env.kube()
    defaults = controller_defaults()
    size = size_text(opts.size_bytes)
    prefix = f"bk{uuid.uuid4().hex[:6]}-"
    raw = RawRbd(env.start_cluster(), opts.size_bytes)
    data: dict[str, Any] = {"pvc_size": size, "burst": n, "repeats": repeats, "image_prefix": prefix,
                            "controller_defaults": {"kube_api_qps": defaults.kube_api_qps,
                                                    "kube_api_burst": defaults.kube_api_burst,
                                                    "worker_threads": defaults.worker_threads}}
    try:
        measured = _measure_controller(env, setup, raw, n=n, repeats=repeats, size=size, prefix=prefix, data=data)
        kube_floor, raw_summary = _measure_floors(setup, raw, n=n, repeats=repeats, size=size, data=data)
    finally:
        raw.close()
    data["samples"] = {k: v.to_json() for k, v in measured.samples.items()}
    floors = _floors_of(kube_floor, raw_summary, data["burst_run"]["limiter_floor_s"])
    result = SectionResult(name=NAME, title=TITLE)
    result.tables = [_latency_table(env, measured, kube_floor, raw_summary, n, size),
                     _stage_table(measured, kube_floor, n), _ratio_table(measured, floors),
                     _memory_table(measured, data["cpu"], n), _footprint_table(env, measured, n, data)]
    result.notes.extend(_notes(measured, data["burst_run"], kube_floor, floors, n))
    result.data = data
    env.shared["kube_provisioning"] = data
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else ratio(a, b)


SECTION = Section(NAME, TITLE, run)
