"""Zone pools through the embedded provisioner on the real control plane and Ceph: a real
`cephcsi --mode=controller --feature-gates=Topology=true --strict-topology` turns a
WaitForFirstConsumer claim's selected node into accessibility requirements (the node's segment
from its CSINode's topology keys and labels), CreateVolume places the volume in the pool
`topologyConstrainedPools` lists for that zone, the PV's node affinity names the zone; a node in a
zone without a pool is RESOURCE_EXHAUSTED and its claim handed back to the scheduler; delete
leaves nothing in the zone pool. Nodes and CSINodes are made here as the kubelet would."""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import DRIVER, new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]

ZONE = "topology.rbd.csi.ceph.com/zone"
SELECTED_NODE = "volume.kubernetes.io/selected-node"


@pytest.fixture
def zone_nodes(env: Env) -> Iterator[dict[str, str]]:
    """Three Nodes in zones a, b and c, each with a CSINode listing the driver's zone key."""
    suffix = uuid.uuid4().hex[:6]
    nodes = {zone: f"tz-{zone}-{suffix}" for zone in "abc"}
    for zone, name in nodes.items():
        env.kube.core.create_node({"metadata": {"name": name, "labels": {ZONE: zone}, "annotations": {
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}})
        env.kube.storage.create_csi_node({"metadata": {"name": name}, "spec": {"drivers": [
            {"name": DRIVER, "nodeID": name, "topologyKeys": [ZONE]}]}})
    try:
        yield nodes
    finally:
        for name in nodes.values():
            env.kube.storage.delete_csi_node(name)
            env.kube.core.delete_node(name)


def rbd_ls(env: Env, pool: str) -> list[str]:
    return sorted(json.loads(env.ceph.admin("rbd", "ls", "-p", pool, "--format", "json") or "[]"))


def claim_on(env: Env, namespace: str, name: str, storage_class: str, node: str) -> str:
    """A claim the scheduler has chosen `node` for (as it annotates WaitForFirstConsumer claims); its uid."""
    claim = env.kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": name, "annotations": {SELECTED_NODE: node}}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}},
            "storageClassName": storage_class}})
    return str(claim.metadata.uid)


def test_a_claim_lands_in_its_zones_pool_and_a_zone_without_one_is_rescheduled(
        env: Env, start_controllers: StartControllers, kube_namespace: str, zone_nodes: dict[str, str]) -> None:
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    pools = json.dumps([
        {"poolName": ceph.pool2, "domainSegments": [{"domainLabel": "zone", "value": "a"}]},
        {"poolName": ceph.pool, "domainSegments": [{"domainLabel": "zone", "value": "b"}]},
    ])
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix,
                                              parameters={"topologyConstrainedPools": pools},
                                              volumeBindingMode="WaitForFirstConsumer")
    start_controllers(args=["--feature-gates=Topology=true", "--strict-topology"])

    uid = claim_on(env, kube_namespace, "zoned", storage_class, zone_nodes["a"])
    wait_for("the zone-a claim to be Bound",
             lambda: ((kube.pvc(kube_namespace, "zoned") or {}).get("status") or {}).get("phase") == "Bound")
    pv = kube.pv(f"pvc-{uid}")
    assert pv is not None
    attributes = pv["spec"]["csi"]["volumeAttributes"]
    assert attributes["pool"] == ceph.pool2, "the volume is not in zone a's pool"
    assert attributes["imageName"] in rbd_ls(env, ceph.pool2)
    assert not [i for i in rbd_ls(env, ceph.pool) if i.startswith(prefix)]
    assert pv["spec"]["nodeAffinity"] == {"required": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": ZONE, "operator": "In", "values": ["a"]}]}]}}

    claim_on(env, kube_namespace, "nowhere", storage_class, zone_nodes["c"])
    wait_for("the zone-c claim handed back to the scheduler", lambda: SELECTED_NODE not in (
        ((kube.pvc(kube_namespace, "nowhere") or {}).get("metadata") or {}).get("annotations") or {}))
    failures = [m for _t, reason, m in kube.events(kube_namespace, "nowhere")
                if reason == "ProvisioningFailed"]
    assert failures and "ResourceExhausted" in failures[0] and "topologyConstrainedPools" in failures[0], failures
    assert not kube.pvs_of(kube_namespace)[1:], "a PV was made for the zone without a pool"

    kube.delete_pvc(kube_namespace, "nowhere")
    kube.delete_pvc(kube_namespace, "zoned")
    wait_for("the PV to go", lambda: kube.pv(f"pvc-{uid}") is None)
    wait_for("the image to leave zone a's pool", lambda: attributes["imageName"] not in rbd_ls(env, ceph.pool2))
