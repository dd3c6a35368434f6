"""Many claims at once through the real controller Deployment: all Bound, one PV and one image
per claim, and everything deleted afterwards; once more with the leader SIGKILLed mid-burst (the
standby takes the Lease over and finishes the work without duplicates or leaks)."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import host
from tests.e2e.checks import DIRECTORY, ceph_volume, wait_ceph_gone
from tests.e2e.env import STORAGE_CLASS, E2EEnv
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, image_name, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]
BURST = 20


def create_claims(e2e: E2EEnv, namespace: str, names: list[str]) -> None:
    for name in names:
        e2e.kube.create_pvc(namespace, name, STORAGE_CLASS, size="8Mi")


def wait_all_bound(e2e: E2EEnv, namespace: str, count: int, timeout: float) -> list[dict[str, Any]]:
    def bound() -> list[dict[str, Any]] | None:
        claims = e2e.kube.pvcs(namespace)
        done = [c for c in claims if c.get("status", {}).get("phase") == "Bound"]
        return claims if len(claims) == count and len(done) == count else None
    return wait_for(f"{count} claims Bound", bound, timeout,
                    explain=lambda: f"{sum(c.get('status', {}).get('phase') == 'Bound' for c in e2e.kube.pvcs(namespace))} Bound")


@dataclass(frozen=True)
class PoolState:
    """Images and journal names in the pool before the burst (another test's leftovers, if
    any, are not this test's business)."""

    images: frozenset[str]
    names: frozenset[str]


def pool_state(e2e: E2EEnv) -> PoolState:
    return PoolState(frozenset(e2e.ceph.images()),
                     frozenset(k.removeprefix("csi.volume.") for k in e2e.ceph.omap(DIRECTORY)))


def assert_one_volume_per_claim(e2e: E2EEnv, namespace: str, claims: list[dict[str, Any]],
                                before: PoolState) -> list[dict[str, Any]]:
    """Exactly one PV per claim, each with its own complete volume in Ceph, and no new image or
    journal entry in the pool that no PV accounts for (a duplicate left by a retry)."""
    pvs = [pv for pv in e2e.kube.pvs() if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace]
    assert sorted(pv["spec"]["claimRef"]["name"] for pv in pvs) == sorted(c["metadata"]["name"] for c in claims)
    assert {c["spec"]["volumeName"] for c in claims} == {pv["metadata"]["name"] for pv in pvs}
    assert len({pv["spec"]["csi"]["volumeHandle"] for pv in pvs}) == len(pvs)
    for pv in pvs:
        volume = ceph_volume(e2e.ceph, pv)
        assert volume.complete, volume
    now = pool_state(e2e)
    assert now.images - before.images == {image_name(pv) for pv in pvs}
    assert now.names - before.names == {pv["metadata"]["name"] for pv in pvs}
    return pvs


def delete_all(e2e: E2EEnv, namespace: str, pvs: list[dict[str, Any]]) -> None:
    for claim in e2e.kube.pvcs(namespace):
        e2e.kube.delete_pvc(namespace, claim["metadata"]["name"])
    wait_for("every PV deleted", lambda: not [pv for pv in pvs if e2e.kube.pv(pv["metadata"]["name"])], timeout=120)
    for pv in pvs:
        wait_ceph_gone(e2e.ceph, pv)


def test_burst_of_claims(e2e: E2EEnv, namespace: str) -> None:
    before = pool_state(e2e)
    started = time.monotonic()
    create_claims(e2e, namespace, [f"c{i:02d}" for i in range(BURST)])
    claims = wait_all_bound(e2e, namespace, BURST, timeout=180)
    elapsed = time.monotonic() - started
    pvs = assert_one_volume_per_claim(e2e, namespace, claims, before)
    print(f"{BURST} claims Bound in {elapsed:.1f}s")
    delete_all(e2e, namespace, pvs)


def controller_pids(pod_uid: str) -> list[int]:
    """Host PIDs of the `cephcsi --mode=controller` process of one pod, found by the pod's
    cgroup (cgroupfs names it pod<uid>); the controller pods share no PID namespace with us."""
    found = []
    for pid, argv in host.processes():
        if "--mode=controller" not in argv:
            continue
        try:
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if f"pod{pod_uid}" in cgroups:
            found.append(pid)
    return found


def test_leader_killed_mid_burst(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    holder = wait_for("a Lease holder", kube.lease_holder, timeout=60)
    by_name = {p["metadata"]["name"]: p for p in kube.pods(DEPLOY_NAMESPACE, CONTROLLER_LABELS)}
    # Identities are "<pod name>_<uuid>", as the Go sidecars make them.
    leader = by_name[holder.split("_", 1)[0]]
    pids = controller_pids(leader["metadata"]["uid"])
    assert pids, f"no controller process found for {leader['metadata']['name']}"

    before = pool_state(e2e)
    first = [f"a{i:02d}" for i in range(BURST // 2)]
    second = [f"b{i:02d}" for i in range(BURST - len(first))]
    create_claims(e2e, namespace, first)
    # Mid-burst: the leader has started on the claims (a PV exists) but is not done.
    wait_for("the first PV of the burst", lambda: any(
        c.get("spec", {}).get("volumeName") for c in kube.pvcs(namespace)), timeout=60)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    create_claims(e2e, namespace, second)

    # The standby takes the Lease over after the lease duration (15s) and finishes the burst.
    claims = wait_all_bound(e2e, namespace, BURST, timeout=180)
    new_holder = kube.lease_holder()
    assert new_holder and new_holder != holder
    pvs = assert_one_volume_per_claim(e2e, namespace, claims, before)
    # The killed container was restarted in place by the kubelet.
    wait_for("the killed controller restarted", lambda: any(
        p["metadata"]["uid"] == leader["metadata"]["uid"] for p in kube.ready_pods(CONTROLLER_LABELS)), timeout=120)
    delete_all(e2e, namespace, pvs)
