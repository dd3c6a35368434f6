"""Throughput and high availability: 50 claims at once, and the leader SIGKILLed mid-burst."""
from __future__ import annotations

import time
from typing import Any

import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import (
    ControllerProcess,
    bound,
    images_with,
    journal_names,
    new_prefix,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph, pytest.mark.slow]

BURST = 50


def report(capsys: pytest.CaptureFixture[str], record_property: Any, name: str, seconds: float) -> None:
    record_property(name, round(seconds, 2))
    with capsys.disabled():
        print(f"\n[sidecars] {name}: {seconds:.2f}s")


def assert_consistent(env: Env, namespace: str, prefix: str) -> None:
    """Every claim bound to its own pvc-<uid>, one PV and one image per claim, and the journal
    naming exactly those volumes."""
    claims = env.kube.pvcs(namespace)
    assert len(claims) == BURST and bound(claims) == BURST
    uids = {c["metadata"]["uid"] for c in claims}
    for claim in claims:
        assert claim["spec"]["volumeName"] == f"pvc-{claim['metadata']['uid']}"
    pvs = env.kube.pvs_of(namespace)
    assert sorted(pv["metadata"]["name"] for pv in pvs) == sorted(f"pvc-{u}" for u in uids), "duplicate or stray PVs"
    images = images_with(env.ceph, prefix)
    assert len(images) == BURST, f"{len(images)} images for {BURST} claims"
    assert sorted(pv["spec"]["csi"]["volumeAttributes"]["imageName"] for pv in pvs) == sorted(images)
    journal = journal_names(env.ceph)
    ours = {name: uuid for name, uuid in journal.items() if name[len("pvc-"):] in uids}
    assert len(ours) == BURST
    assert sorted(f"{prefix}{uuid}" for uuid in ours.values()) == sorted(images)


def delete_all(env: Env, namespace: str, prefix: str, timeout: float = 120) -> float:
    began = time.monotonic()
    for claim in env.kube.pvcs(namespace):
        env.kube.delete_pvc(namespace, claim["metadata"]["name"])
    wait_for("every PV to be deleted", lambda: not env.kube.pvs_of(namespace), timeout=timeout)
    wait_for("every image to be deleted", lambda: not images_with(env.ceph, prefix), timeout=timeout)
    return time.monotonic() - began


def test_burst_of_50_claims(env: Env, start_controllers: StartControllers, kube_namespace: str,
                            capsys: pytest.CaptureFixture[str], record_property: Any) -> None:
    (controller,) = start_controllers()
    wait_for("leadership", controller.is_leader)
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    began = time.monotonic()
    env.kube.create_pvcs(kube_namespace, [f"burst-{i:02d}" for i in range(BURST)], storage_class)
    # kube-controller-manager's PV binder (client QPS 20 by default) annotates each claim for us
    # before we may act and binds it after: it paces the burst, so our own latency is reported too.
    wait_for("all PVs created", lambda: len(env.kube.pvs_of(kube_namespace)) == BURST, timeout=120)
    report(capsys, record_property, "50 PVCs created to all PVs created", time.monotonic() - began)
    wait_for("all claims Bound", lambda: bound(env.kube.pvcs(kube_namespace)) == BURST, timeout=120)
    report(capsys, record_property, "50 PVCs created to all Bound", time.monotonic() - began)
    labels = {"operation": "provision", "outcome": "success"}
    count = controller.metric("cephcsi_sidecar_operation_seconds_count", **labels)
    total = controller.metric("cephcsi_sidecar_operation_seconds_sum", **labels)
    # A claim processed again before the informer shows its new PV adopts that PV (no second
    # volume) and counts as another success; duplicates are ruled out by assert_consistent.
    assert count is not None and count >= BURST and total is not None
    report(capsys, record_property, "mean provisioning time per claim (annotated claim to PV)", total / count)
    assert_consistent(env, kube_namespace, prefix)
    report(capsys, record_property, "50 PVCs deleted to all images gone", delete_all(env, kube_namespace, prefix))
    assert not [n for n in journal_names(env.ceph) if n.startswith("pvc-") and env.kube.pv(n)]


def test_leader_killed_during_a_burst(env: Env, start_controllers: StartControllers, kube_namespace: str,
                                      capsys: pytest.CaptureFixture[str], record_property: Any) -> None:
    replicas = start_controllers(2)
    leader = wait_for("a leader", lambda: next((r for r in replicas if r.is_leader()), None))
    assert isinstance(leader, ControllerProcess)
    standby = next(r for r in replicas if r is not leader)
    wait_for("the standby's caches to sync", lambda: standby.http("/readyz")[0] == 200)
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    began = time.monotonic()
    env.kube.create_pvcs(kube_namespace, [f"burst-{i:02d}" for i in range(BURST)], storage_class)
    # Kill as soon as the first PV exists: most CreateVolume calls are then in flight.
    wait_for("the first PV", lambda: env.kube.pvs_of(kube_namespace), timeout=60, interval=0.05)
    done_at_kill = len(env.kube.pvs_of(kube_namespace))
    leader.kill()
    killed = time.monotonic()
    wait_for("the standby to take over", standby.is_leader, timeout=30)
    took_over = time.monotonic()
    wait_for("all claims Bound after failover", lambda: bound(env.kube.pvcs(kube_namespace)) == BURST, timeout=120)
    report(capsys, record_property, f"failover burst: PVs at kill={done_at_kill}, takeover", took_over - killed)
    report(capsys, record_property, "failover burst: created to all Bound", time.monotonic() - began)
    assert_consistent(env, kube_namespace, prefix)
    delete_all(env, kube_namespace, prefix)
