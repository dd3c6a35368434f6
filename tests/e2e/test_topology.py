"""docs/topology.md walked on the real node: overlays/topology/ turned on as a user does, and a
WaitForFirstConsumer claim of a `topologyConstrainedPools` class placed by the node's zone.

The node is labelled `topology.kubernetes.io/zone`, overlays/topology/ applied with this install's
config.json (as the e2e env applies deploy/), the controller rolls and the node plugin pod is
replaced (the DaemonSet is OnDelete); the kubelet then publishes the plugin's key in CSINode. The
class lists two pools: another zone's first, the node's zone's second, and its own `pool` is the
other zone's pool, so the claim lands in the node's zone's pool only through the topology path
(without requirements it would go to the class's `pool`, and a first-match on the wrong entry
would too).

Which pool is the node's zone's: the test cluster's `rbd`, the other zone's its second RBD pool
(`pool2`, on which the csi user has caps). Not the other way round, because the e2e node maps with
rbd-fuse (no rbd or nbd kernel module here), and the image's rbd-fuse (libfuse3) crashes on any
pool option, so it can serve only the pool `rbd` (cephcsi/node/mappers/fuse.py): a volume in the
second pool could be provisioned here but never staged.

Everything goes back in `finally`: the claim's volume deleted (nothing left in either pool), the
class, the install as the e2e env applied it (the controller rolled back and the node plugin pod
replaced again, so later tests get the flags as shipped), the node labels (also the one the
kubelet adds from NodeGetInfo), and the restore is asserted: the driver's args, the node's labels
and the CSINode keys as before the test.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.checks import DIRECTORY, ceph_volume, wait_ceph_gone, watchers
from tests.e2e.env import IMAGE, REPO, SECRET, E2EEnv, quickstart_config, storage_class, write_overlay
from tests.e2e.kube import DEPLOY_NAMESPACE, DRIVER, NODE_LABELS, Kube, image_name, wait_for
from tests.e2e.test_volumes import IDLE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400, func_only=True)]
log = logging.getLogger(__name__)

TOPOLOGY_OVERLAY = REPO / "overlays" / "topology"
ZONE_LABEL = "topology.kubernetes.io/zone"
"""The node label overlays/topology/ names in --domainlabels."""
ZONE_KEY = "topology.rbd.csi.ceph.com/zone"
"""The segment the node plugin reports for it, and the node label the kubelet adds from it."""
CLASS = "csi-rbd-zoned"
ZONE = "e2e-zone-a"
OTHER_ZONE = "e2e-zone-b"


# ---- the install ------------------------------------------------------------------------------------


def driver_args(kube: Kube) -> dict[str, list[str]]:
    """The cephcsi container's args of the controller Deployment and the node DaemonSet."""
    found = {}
    for kind, name in (("deployment", "cephcsi-controller"), ("daemonset", "cephcsi-node")):
        doc = json.loads(kube.kubectl("-n", DEPLOY_NAMESPACE, "get", kind, name, "-o", "json"))
        [container] = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "cephcsi"]
        found[kind] = list(container["args"])
    return found


def node_labels(kube: Kube, node: str) -> dict[str, str]:
    labels: dict[str, str] = json.loads(kube.kubectl("get", "node", node, "-o", "json"))["metadata"].get("labels") or {}
    return labels


def topology_keys(kube: Kube, node: str) -> list[str] | None:
    """The driver's topologyKeys in the node's CSINode ([] for none); None while not registered."""
    for driver in ((kube.csinode(node) or {}).get("spec") or {}).get("drivers") or []:
        if driver["name"] == DRIVER:
            return list(driver.get("topologyKeys") or [])
    return None


def roll_out(kube: Kube, node: str) -> None:
    """What a user does after `kubectl apply -k` of a flag change: the controller Deployment rolls
    by itself (wait for it); the node DaemonSet is OnDelete, so its pod on the node is deleted and
    the one the DaemonSet makes in its place waited for."""
    kube.kubectl("-n", DEPLOY_NAMESPACE, "rollout", "status", "deployment/cephcsi-controller", "--timeout=180s",
                 timeout=200)
    old = {p["metadata"]["uid"] for p in kube.pods(DEPLOY_NAMESPACE, NODE_LABELS)}
    for pod in kube.pods(DEPLOY_NAMESPACE, NODE_LABELS):
        kube.delete_pod(DEPLOY_NAMESPACE, pod["metadata"]["name"], timeout=120)
    wait_for("a new node plugin pod Ready", lambda: [p for p in kube.ready_pods(NODE_LABELS)
                                                    if p["metadata"]["uid"] not in old], timeout=180)
    kube.wait_driver_ready(node)


def capacities(kube: Kube) -> list[tuple[str, str]]:
    """(class, segment) of every CSIStorageCapacity object in the driver's namespace."""
    items = json.loads(kube.storage.list_namespaced_csi_storage_capacity(
        DEPLOY_NAMESPACE, _preload_content=False).data)["items"]
    return sorted((c["storageClassName"], json.dumps((c.get("nodeTopology") or {}).get("matchLabels") or {},
                                                     sort_keys=True)) for c in items)


def apply_topology_overlay(env: E2EEnv, directory: Path) -> None:
    """`kubectl apply -k overlays/topology/` with this install's config.json, the way the e2e env
    applies deploy/."""
    write_overlay(directory, quickstart_config(env.ceph), base=TOPOLOGY_OVERLAY)
    env.kube.kubectl("apply", "-k", str(directory))


# ---- Ceph, as client.admin ---------------------------------------------------------------------------


def pool_id(env: E2EEnv, pool: str) -> int:
    pools = json.loads(env.ceph.admin("ceph", "osd", "pool", "ls", "detail", "--format", "json"))
    [found] = [p["pool_id"] for p in pools if p["pool_name"] == pool]
    return int(found)


def pool_traces(env: E2EEnv, pool: str, pv: dict[str, Any]) -> list[str]:
    """What of the volume is in `pool`: its image, its record object, its name key."""
    ceph, name = env.ceph, pv["metadata"]["name"]
    image = image_name(pv)
    uid = pv["spec"]["csi"]["volumeHandle"][-36:]
    traces = []
    if image in json.loads(ceph.admin("rbd", "ls", "-p", pool, "--format", "json") or "[]"):
        traces.append(f"image {image}")
    if any(e.get("name") == image for e in json.loads(
            ceph.admin("rbd", "trash", "ls", "-p", pool, "--format", "json") or "[]")):
        traces.append(f"trashed image {image}")
    objects = ceph.admin("rados", "-p", pool, "ls").split()
    if f"csi.volume.{uid}" in objects:
        traces.append(f"record csi.volume.{uid}")
    if DIRECTORY in objects and f"csi.volume.{name}" in ceph.admin(
            "rados", "-p", pool, "listomapkeys", DIRECTORY).split():
        traces.append(f"name key csi.volume.{name}")
    return traces


# ---- the walk ------------------------------------------------------------------------------------------


def zoned_class(env: E2EEnv) -> dict[str, Any]:
    ceph = env.ceph
    doc = storage_class(ceph, CLASS)
    doc["volumeBindingMode"] = "WaitForFirstConsumer"
    doc["parameters"]["pool"] = ceph.pool2
    doc["parameters"]["topologyConstrainedPools"] = json.dumps([
        {"poolName": ceph.pool2, "domainSegments": [{"domainLabel": "zone", "value": OTHER_ZONE}]},
        {"poolName": ceph.pool, "domainSegments": [{"domainLabel": "zone", "value": ZONE}]},
    ])
    assert doc["parameters"]["csi.storage.k8s.io/provisioner-secret-name"] == SECRET
    return doc


def test_zone_claim_lands_in_its_zones_pool(e2e: E2EEnv, namespace: str) -> None:
    kube, ceph, node = e2e.kube, e2e.ceph, e2e.node.name
    assert ceph.pool2 and ceph.pool2 != ceph.pool, "the test cluster's second RBD pool"
    args_before, labels_before, capacities_before = driver_args(kube), node_labels(kube, node), capacities(kube)
    assert topology_keys(kube, node) == [], "the install as shipped reports no topology"
    assert not {ZONE_LABEL, ZONE_KEY} & set(labels_before), labels_before
    token = uuid.uuid4().hex
    timings: dict[str, float] = {}
    started = time.monotonic()
    pv: dict[str, Any] | None = None
    try:
        # -- docs/topology.md steps 1 and 2: label, overlay, controller rolled, node plugin replaced.
        kube.kubectl("label", "node", node, f"{ZONE_LABEL}={ZONE}")
        apply_topology_overlay(e2e, e2e.work_dir / "topology-overlay")
        args = driver_args(kube)
        assert args["daemonset"] == [*args_before["daemonset"], f"--domainlabels={ZONE_LABEL}"]
        assert args["deployment"] == [*args_before["deployment"], "--feature-gates=Topology=true", "--strict-topology"]
        roll_out(kube, node)
        wait_for(f"CSINode {node}: {DRIVER} with the zone key", lambda: topology_keys(kube, node) == [ZONE_KEY],
                 timeout=60, explain=lambda: json.dumps(kube.csinode(node)))
        assert node_labels(kube, node).get(ZONE_KEY) == ZONE, "the kubelet labels the node with the segment"
        timings["turned on"] = time.monotonic() - started

        # -- Step 3: the class; its claim waits for a consumer.
        kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(zoned_class(e2e)))
        kube.create_pvc(namespace, "zoned", CLASS)
        wait_for("the claim's WaitForFirstConsumer event", lambda: "WaitForFirstConsumer" in kube.events(
            namespace, "zoned"), timeout=60)
        claim = kube.pvc(namespace, "zoned") or {}
        assert claim["status"].get("phase") == "Pending" and not claim["spec"].get("volumeName"), claim
        assert "volume.kubernetes.io/selected-node" not in (claim["metadata"].get("annotations") or {}), claim

        # -- A pod uses it: scheduled, provisioned in the zone's pool, staged, written and read.
        kube.create_pod(namespace, "app", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "zoned")
        pv = kube.wait_bound(namespace, "zoned", timeout=180)
        kube.wait_pod_ready(namespace, "app", timeout=180)
        assert kube.wait_written(namespace, "app", "/data/token") == token
        assert kube.exec_in(namespace, "app", "cat /data/token").strip() == token
        timings["claim bound, pod running"] = time.monotonic() - started

        # The PV: node affinity on the zone, the zone's pool in its id and attributes.
        assert pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"] == [
            {"matchExpressions": [{"key": ZONE_KEY, "operator": "In", "values": [ZONE]}]}], pv["spec"]["nodeAffinity"]
        handle = pv["spec"]["csi"]["volumeHandle"]
        assert int(handle[-53:-37], 16) == pool_id(e2e, ceph.pool) != pool_id(e2e, ceph.pool2), handle
        attributes = pv["spec"]["csi"]["volumeAttributes"]
        assert attributes["pool"] == ceph.pool, attributes
        # The scheduler placed the pod by the zone's capacity object (the CSIDriver has
        # storageCapacity: true): the zone's pool's room, tracked per segment.
        assert (CLASS, json.dumps({ZONE_KEY: ZONE})) in capacities(kube), capacities(kube)
        # Ceph itself: the whole volume (image, name key, record) in the zone's pool, mapped from
        # it by the node; nothing of it in the class's `pool`.
        image = image_name(pv)
        volume = ceph_volume(ceph, pv)
        assert volume.complete, volume
        assert json.loads(ceph.admin("rbd", "info", "-p", ceph.pool, image, "--format", "json"))["name"] == image
        assert watchers(ceph, image), "the node's rbd-fuse maps the image from the zone's pool"
        assert pool_traces(e2e, ceph.pool2, pv) == []

        kube.delete_pod(namespace, "app", timeout=120)
        kube.delete_pvc(namespace, "zoned")
        kube.wait_pv_gone(pv["metadata"]["name"], timeout=120)
        wait_ceph_gone(ceph, pv, timeout=120)
        assert pool_traces(e2e, ceph.pool, pv) == [] and pool_traces(e2e, ceph.pool2, pv) == []
        timings["claim deleted"] = time.monotonic() - started
    finally:
        restore(e2e, namespace, pv)
        timings["restored"] = time.monotonic() - started
        log.info("topology e2e timings (s since start): %s", {k: round(v, 1) for k, v in timings.items()})
    # The install as before: same args, same labels, no topology in CSINode, the same capacity
    # objects (the class's zone segment gone with the class).
    assert driver_args(kube) == args_before
    assert node_labels(kube, node) == labels_before
    assert topology_keys(kube, node) == []
    wait_for("the capacity objects as before", lambda: capacities(kube) == capacities_before, timeout=60,
             explain=lambda: repr(capacities(kube)))


def restore(env: E2EEnv, namespace: str, pv: dict[str, Any] | None) -> None:
    """Every step is tried; the first failure is raised at the end."""
    kube, node = env.kube, env.node.name
    failures: list[BaseException] = []

    def step(action: Any, *args: Any, **kwargs: Any) -> None:
        try:
            action(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - the remaining steps must still run
            log.warning("topology e2e restore step failed: %s", error)
            failures.append(error)

    step(kube.delete_pod, namespace, "app", timeout=120)
    step(kube.delete_pvc, namespace, "zoned")
    if pv is not None:
        step(kube.wait_pv_gone, pv["metadata"]["name"], timeout=120)
        step(wait_ceph_gone, env.ceph, pv, timeout=120)
    step(kube.kubectl, "delete", "--ignore-not-found", "storageclass", CLASS)
    # The install exactly as the e2e env applied it (tests.e2e.env.install / set_config).
    step(kube.kubectl, "apply", "-k", str(env.overlay))
    step(roll_out, kube, node)
    # docs/topology.md says the kubelet leaves its segment label on the node when the plugin
    # stops reporting it; logged to keep that checked.
    step(lambda: log.info("after the restore the node still has %s=%s", ZONE_KEY,
                          node_labels(kube, node).get(ZONE_KEY)))
    step(kube.kubectl, "label", "node", node, f"{ZONE_LABEL}-", f"{ZONE_KEY}-")
    step(wait_for, f"CSINode {node}: {DRIVER} without topology keys", lambda: topology_keys(kube, node) == [],
         timeout=60)
    if failures:
        raise failures[0]
