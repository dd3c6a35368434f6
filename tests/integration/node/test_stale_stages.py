"""The node plugin's start-up sweep of stale stages (issue 34; cephcsi.node.stale_stages) with
real peers: a cephcsi node process reading its Node from the test control plane, volumes staged
by rbd-fuse on the real Ceph cluster at the kubelet's staging paths. After a SIGKILL and a new
start, a volume the Node's status no longer lists is unstaged (its mount, loop device, rbd-fuse
daemon and record gone), one listed as attached is left as it was, and one a pod still
publishes is left too (unstage refuses it; the kubelet unpublishes first).
"""
from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterator

import kubernetes.client
import pytest

from cephcsi.node.mounts import read_mounts, top_mount
from cephcsi.node.stage_record import RECORD_NAME
from cephcsi.node.stale_stages import unique_name
from tests.ceph.fixtures import CephTestCluster
from tests.controlplane.cluster import ControlPlane
from tests.integration.node.conftest import NodeEnv, Volume, assert_no_leftovers, mount_cap, running_node_env

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.kube]

DRIVER = "rbd.csi.ceph.com"


@pytest.fixture(scope="module")
def node_name(control_plane: ControlPlane) -> Iterator[str]:
    name = f"stale-{uuid.uuid4().hex[:6]}"
    with control_plane.api_client() as admin:
        kubernetes.client.CoreV1Api(admin).create_node({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with control_plane.api_client() as admin:
            kubernetes.client.CoreV1Api(admin).delete_node(name)


@pytest.fixture(scope="module")
def node_env(ceph_cluster: CephTestCluster, control_plane: ControlPlane, node_name: str) -> Iterator[NodeEnv]:
    """This module's node plugin: as the other node tests', with an API to read its Node from."""
    with running_node_env(ceph_cluster, node_name, "nds-", (
            f"--kubeconfig={control_plane.kubeconfig}", "--reclaimspace-poll-interval=0")) as env:
        yield env


def staging_path(env: NodeEnv, volume: Volume) -> str:
    """Where the kubelet (1.24+) stages a Filesystem volume of this driver."""
    digest = hashlib.sha256(volume.volume_id.encode()).hexdigest()
    path = os.path.join(env.kubelet, "plugins/kubernetes.io/csi", DRIVER, digest, "globalmount")
    os.makedirs(path)
    return path


def set_attached(control_plane: ControlPlane, node: str, volumes: list[Volume]) -> None:
    with control_plane.api_client() as admin:
        kubernetes.client.CoreV1Api(admin).patch_node_status(node, {"status": {"volumesAttached": [
            {"name": unique_name(DRIVER, v.volume_id), "devicePath": ""} for v in volumes], "volumesInUse": None}})


def mounted(path: str) -> bool:
    return top_mount(path, read_mounts()) is not None


def test_restart_unstages_only_what_kubernetes_no_longer_attaches(
        env: NodeEnv, make_volume: Callable[..., Volume], control_plane: ControlPlane, node_name: str) -> None:
    cap = mount_cap()
    stale, attached, published = make_volume(), make_volume(), make_volume()
    paths = {v.volume_id: staging_path(env, v) for v in (stale, attached, published)}
    for volume in (stale, attached, published):
        volume.stage(paths[volume.volume_id], cap)
    target = env.target()
    published.publish(paths[published.volume_id], target, cap)
    with open(os.path.join(target, "kept.txt"), "w", encoding="utf-8") as handle:
        handle.write("still used by a pod")
    set_attached(control_plane, node_name, [attached])

    env.driver.kill()
    env.driver.start()  # serves only after the sweep

    log = env.driver.log()
    assert "unstaged a volume Kubernetes no longer attaches to this node" in log, log[-3000:]
    assert stale.volume_id in log
    stale_path = paths[stale.volume_id]
    assert not mounted(os.path.join(stale_path, "fs"))
    assert not os.path.exists(os.path.join(stale_path, RECORD_NAME))
    assert stale.watchers() == [], "the stale volume's rbd-fuse still watches the image"
    # Listed as attached: untouched. Published: refused by unstage, untouched.
    assert mounted(os.path.join(paths[attached.volume_id], "fs"))
    assert os.path.exists(os.path.join(paths[attached.volume_id], RECORD_NAME))
    assert "stale stage left in place" in log and "still published" in log, log[-3000:]
    with open(os.path.join(target, "kept.txt"), encoding="utf-8") as handle:
        assert handle.read() == "still used by a pod"

    # The kubelet's own calls still work on what was kept; then nothing is left.
    published.unpublish(target)
    for volume in (attached, published):
        volume.unstage(paths[volume.volume_id])
    stale.unstage(stale_path)  # idempotent after the sweep
    assert_no_leftovers(env, stale, attached, published)
