"""Restarts under a mounted volume: the node plugin (its rbd-fuse daemons die with its container)
and the kubelet (containers and mounts outlive it). Either way the workload pod must still be
deletable afterwards and leave nothing behind on the node or in Ceph."""
from __future__ import annotations

import uuid

import pytest

from tests.e2e.checks import driver_data_path, node_leftovers, wait_node_clean
from tests.e2e.diagnostics import volume_report
from tests.e2e.env import IMAGE, E2EEnv
from tests.e2e.kube import DEPLOY_NAMESPACE, DRIVER, NODE_LABELS, image_name, wait_for
from tests.e2e.test_volumes import IDLE, delete_claim, provision

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def test_node_plugin_restarted_under_a_mounted_volume(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    pv = provision(e2e, namespace, "data")
    image = image_name(pv)
    kube.create_pod(namespace, "app", IMAGE, f"echo {uuid.uuid4().hex} > /data/token && sync && {IDLE}", "data")
    kube.wait_pod_ready(namespace, "app")
    assert node_leftovers(pv, image).fuse_daemons, "the volume is served by an rbd-fuse daemon"

    [old] = kube.ready_pods(NODE_LABELS)
    kube.delete_pod(DEPLOY_NAMESPACE, old["metadata"]["name"], timeout=120)
    # The DaemonSet's replacement registers again with the kubelet.
    wait_for("a new node plugin Ready",
             lambda: [p for p in kube.ready_pods(NODE_LABELS) if p["metadata"]["uid"] != old["metadata"]["uid"]],
             timeout=120)
    wait_for(f"CSINode listing {DRIVER} again", lambda: DRIVER in kube.csinode_drivers(e2e.node.name), timeout=60)

    # The volume's mapping died with the old container; unpublish + unstage by the new plugin
    # must still release the mounts, the loop device and whatever rbd-fuse is left.
    kube.delete_pod(namespace, "app", timeout=120)
    wait_node_clean(pv, image, timeout=60)
    assert not driver_data_path(), driver_data_path()

    delete_claim(e2e, namespace, "data", pv)


def test_kubelet_restarted_with_a_mounted_volume(e2e: E2EEnv, namespace: str) -> None:
    kube = e2e.kube
    token = uuid.uuid4().hex
    pv = provision(e2e, namespace, "data")
    image = image_name(pv)
    kube.create_pod(namespace, "app", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "data")
    before = kube.wait_pod_ready(namespace, "app")
    # The restart must come after the write (Ready only means the container started).
    assert kube.wait_written(namespace, "app", "/data/token") == token

    e2e.node.restart_kubelet()
    uid = before["metadata"]["uid"]
    wait_for("the restarted kubelet managing the pod again", lambda: uid in e2e.node.kubelet_pod_uids(), timeout=60)

    # Same pod, same container (not restarted), the volume still mounted and readable.
    after = kube.wait_pod_ready(namespace, "app", timeout=120)
    try:
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert [c["restartCount"] for c in after["status"]["containerStatuses"]] == [0]
        assert [c["containerID"] for c in after["status"]["containerStatuses"]] == \
            [c["containerID"] for c in before["status"]["containerStatuses"]]
        assert kube.exec_in(namespace, "app", "cat /data/token").strip() == token
        assert kube.exec_in(namespace, "app", f"echo {token}-2 > /data/token2 && sync && cat /data/token2").strip() \
            == f"{token}-2"
    except AssertionError as error:
        raise AssertionError(f"{error}\n{volume_report(e2e, namespace, 'app', pv)}") from None

    # The restarted kubelet rebuilt its view of the mounted volume: deletion unpublishes and
    # unstages it like any other.
    kube.delete_pod(namespace, "app", timeout=120)
    wait_node_clean(pv, image)
    delete_claim(e2e, namespace, "data", pv)
