"""Section 4b: leader failover between two `cephcsi --mode=controller` replicas sharing one Lease
(default timings: lease 15 s / renew deadline 10 s / retry period 2 s), on the real control plane
and Ceph cluster.

Each round: find the leader (its /metrics leader_election_master_status) and a standby whose
caches are synced (/readyz), note the Lease's holderIdentity and renewTime, signal the leader
(SIGTERM = graceful, SIGKILL = crash), create a new PVC right after the signal, then poll the
Lease through the API every 50 ms. Reported from the signal: the Lease released (graceful: the
leader writes holderIdentity ""), the Lease held by another identity, the new PVC Bound, the old
leader exited. The old leader is then replaced by a fresh replica (the next standby).

What leader election should give (cephcsi.kube.leaderelection): graceful ≈ one standby poll
(retry period × up to 1.2) after the release; SIGKILL ≈ the lease duration counted from when the
standby saw the last renewal: lease − retry … lease + 1.2 × retry.
"""
from __future__ import annotations

import datetime
import logging
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from bench import kubestats, report
from bench.environment import Environment
from bench.kube import (
    SECRET,
    Claims,
    KubeSetup,
    controller_defaults,
    delete_claims,
    images_with,
    log_problems,
    size_text,
    wait_until,
)
from bench.kubestats import Timings
from bench.model import SectionResult, Table
from bench.raw import RawRbd
from bench.sections.base import Section
from tests.integration.sidecars.harness import ControllerProcess

log = logging.getLogger("bench")

NAME = "kube-failover"
TITLE = "4b. Kubernetes: leader failover of the embedded sidecars (2 replicas, one Lease)"
POLL_S = 0.05


@dataclass
class Round:
    kind: str
    run: int
    renew_age_s: float | None
    """How old the Lease's last renewal was when the leader was signalled."""
    released_s: float | None = None
    takeover_s: float | None = None
    """Signal → the Lease held by another identity (read through the API)."""
    standby_leader_s: float | None = None
    """Signal → the standby's own leader_election_master_status = 1."""
    bound_s: float | None = None
    """Signal → the PVC created right after it is Bound."""
    exited_s: float | None = None
    exit_code: int | None = None
    new_holder: str = ""
    error: str = ""


def _leader(replicas: list[ControllerProcess], timeout: float) -> ControllerProcess | None:
    found: list[ControllerProcess] = []

    def check() -> bool:
        found[:] = [r for r in replicas if r.is_leader()]
        return len(found) == 1

    return found[0] if wait_until(check, timeout, interval=0.2) is not None else None


def _round(setup: KubeSetup, claims: Claims, replicas: list[ControllerProcess], kind: str, run: int,
           lease_namespace: str, storage_class: str, size: str, timings: Timings) -> Round:
    leader = _leader(replicas, timings.lease_duration_s + 30)
    if leader is None:
        return Round(kind, run, None, error="no single leader among the replicas")
    standby = next(r for r in replicas if r is not leader)
    if wait_until(lambda: standby.http("/readyz")[0] == 200, 60) is None:
        return Round(kind, run, None, error="the standby never became ready")
    before = setup.lease(lease_namespace)
    age = None
    if before.renew_time is not None:
        age = (datetime.datetime.now(datetime.timezone.utc) - before.renew_time).total_seconds()
    result = Round(kind, run, age)
    name = f"{kind}-{run}"
    assert leader.process is not None
    t0 = time.monotonic()
    leader.process.send_signal(signal.SIGTERM if kind == "graceful" else signal.SIGKILL)
    setup.kube.create_pvc(claims.namespace, name, storage_class, size)
    deadline = t0 + timings.lease_duration_s + 45
    last_metrics = 0.0
    while time.monotonic() < deadline:
        now = time.monotonic()
        lease = setup.lease(lease_namespace)
        if result.released_s is None and lease.holder == "":
            result.released_s = now - t0
        if result.takeover_s is None and lease.holder and lease.holder != before.holder:
            result.takeover_s, result.new_holder = now - t0, lease.holder
        if result.exited_s is None and leader.process.poll() is not None:
            result.exited_s, result.exit_code = now - t0, leader.process.returncode
        if result.standby_leader_s is None and now - last_metrics >= 0.2:
            last_metrics = now
            if standby.is_leader():
                result.standby_leader_s = time.monotonic() - t0
        bound_at = claims.pvcs.first("bound").get(name)
        if bound_at is not None:
            result.bound_s = bound_at - t0
        if None not in (result.takeover_s, result.standby_leader_s, result.bound_s, result.exited_s):
            break
        time.sleep(POLL_S)
    else:
        result.error = "timed out waiting for the failover"
    leader.stop(timeout=30)  # reaps it (already exited, or SIGTERM again)
    return result


def _expected(r: Round, timings: Timings) -> str:
    """The takeover window from the signal: graceful counts from the release (the leader first
    drains what it is doing), SIGKILL from the kill."""
    low, high = timings.expected(r.kind)
    offset = (r.released_s or 0.0) if r.kind == "graceful" else 0.0
    return f"{low + offset:.1f}–{high + offset:.1f}"


def _row(table: Table, r: Round, timings: Timings) -> None:
    table.add(r.kind, r.run, report.num(r.renew_age_s, 2), report.num(r.released_s, 2), report.num(r.takeover_s, 2),
              report.num(r.standby_leader_s, 2), report.num(r.bound_s, 2), report.num(r.exited_s, 2),
              _expected(r, timings), r.error or ("" if r.exit_code in (None, 0, -9) else f"exit {r.exit_code}"))


def _run_rounds(env: Environment, setup: KubeSetup, timings: Timings,
                data: dict[str, Any]) -> tuple[list[Round], list[str]]:
    """Every failover round on two replicas, then delete the claims; (rounds, controller warnings)."""
    opts = env.options
    cluster = env.start_cluster()
    size = size_text(opts.size_bytes)
    prefix = f"bf{uuid.uuid4().hex[:6]}-"
    namespace = setup.namespace("bench-4b")
    lease_namespace = setup.namespace("bench-le")
    storage_class = setup.kube.create_storage_class(cluster, SECRET, prefix=prefix)
    raw = RawRbd(cluster, opts.size_bytes)
    kinds = ["graceful"] * opts.failover_graceful + ["sigkill"] * opts.failover_kill
    rounds: list[Round] = []
    claims: Claims | None = None
    try:
        claims = Claims(setup, namespace)
        replicas = setup.start_controllers(env, 2, lease_namespace)
        for i, kind in enumerate(kinds):
            log.info("failover round %d: %s", i, kind)
            r = _round(setup, claims, replicas, kind, i, lease_namespace, storage_class, size, timings)
            rounds.append(r)
            if r.error:
                break
            alive = [p for p in replicas if p.process is not None and p.process.poll() is None]
            replicas = alive + (setup.start_controllers(env, 1, lease_namespace) if i + 1 < len(kinds) else [])
        names = [f"{r.kind}-{r.run}" for r in rounds]
        data["images_before_delete"] = len(images_with(raw, prefix))
        data["pvs_before_delete"] = len(setup.kube.pvs_of(namespace))
        data["delete"] = delete_claims(setup, claims, names, raw, prefix, 120).to_json()
    finally:
        if claims is not None:
            claims.stop()
        processes: list[ControllerProcess] = list(setup.processes)
        setup.stop_controllers()
        raw.close()
    return rounds, [line for proc in processes for line in log_problems(proc)]


def _rounds_table(rounds: list[Round], timings: Timings) -> Table:
    table = Table(title=f"seconds from the signal to the leader; a new PVC is created right after the signal; "
                        f"timings: {timings.label()}",
                  columns=["failover", "run", "last renewal age at signal", "Lease released", "standby holds Lease",
                           "standby leader metric", "new PVC Bound", "old leader exited", "expected takeover",
                           "note"])
    for r in rounds:
        _row(table, r, timings)
    return table


def _summary_table(rounds: list[Round], timings: Timings, data: dict[str, Any]) -> Table:
    summary = Table(title="p50 (nearest rank) per kind",
                    columns=["failover", "runs", "standby holds Lease s", "new PVC Bound s", "expected takeover s"])
    data["summary"] = {}
    for kind in ("graceful", "sigkill"):
        mine = [r for r in rounds if r.kind == kind]
        if not mine:
            continue
        low, high = timings.expected(kind)
        take = kubestats.median(r.takeover_s for r in mine)
        bound = kubestats.median(r.bound_s for r in mine)
        summary.add(kind, len(mine), report.num(take, 2), report.num(bound, 2),
                    f"{'release + ' if kind == 'graceful' else ''}{low:.1f}–{high:.1f}")
        data["summary"][kind] = {"takeover_p50_s": take, "bound_p50_s": bound, "expected": [low, high]}
    return summary


def _notes(rounds: list[Round], data: Mapping[str, Any], problems: list[str]) -> list[str]:
    notes = [
        f"{len(rounds)} PVCs created across the failovers → {data['images_before_delete']} images, "
        f"{data['pvs_before_delete']} PVs (one each expected); deleting them: PVs left "
        f"{len(data['delete']['pvs_left'])}, images gone after {report.num(data['delete']['images_gone_s'], 2)} s, "
        f"trash purged after {report.num(data['delete']['trash_empty_s'], 2)} s.",
        "Graceful: the leader stops its loops (finishing a provisioning in flight — it still holds the Lease, so a "
        "PVC can be Bound by the old leader before the hand-over) and releases the Lease (holderIdentity \"\", "
        "duration 1 s); the standby takes it at its next poll (retry period × up to 1.2 after the release). "
        "SIGKILL: nobody releases it; the standby waits the lease duration from when it saw the last renewal."]
    if problems:
        uniq = list(dict.fromkeys(p.split(" ", 2)[-1][:160] for p in problems))
        notes.append(f"controller warnings during the rounds ({len(problems)} lines): " + " | ".join(uniq[:4]))
    return notes


def run(env: Environment) -> SectionResult:
    """Run the failover rounds, then tabulate them against what leader election should give."""
    result = SectionResult(name=NAME, title=TITLE)
    setup: KubeSetup = env.kube()
    defaults = controller_defaults()
    timings = Timings(defaults.lease_duration, defaults.renew_deadline, defaults.retry_period)
    data: dict[str, Any] = {"timings": asdict(timings)}
    rounds, problems = _run_rounds(env, setup, timings, data)
    data["rounds"] = [asdict(r) for r in rounds]
    result.tables = [_rounds_table(rounds, timings), _summary_table(rounds, timings, data)]
    result.notes.extend(_notes(rounds, data, problems))
    data["log_problems"] = problems[:20]
    result.data = data
    if any(r.error for r in rounds):
        result.status, result.reason = "failed", "; ".join(f"{r.kind}-{r.run}: {r.error}" for r in rounds if r.error)
    return result


SECTION = Section(NAME, TITLE, run)
