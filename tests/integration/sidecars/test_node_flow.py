"""The whole life of a volume as Kubernetes drives it: the provisioner makes the PV, the
attach-detach controller and our attacher attach it, the test plays the kubelet against a real
`cephcsi --mode=node` process (NodeStage/NodePublish with what the PV says, the way the kubelet
builds those requests), data is written and read back after a re-stage, and everything is undone
in reverse down to the image."""
from __future__ import annotations

import base64
import os
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import mounts_under, release_everything, remove_tree
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import images_with, new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]

Cap = csi_pb2.VolumeCapability


@pytest.fixture
def node_plugin(env: Env) -> Iterator[tuple[DriverProcess, str, str]]:
    """(node-mode driver, its kubelet dir, its node name)."""
    root = tempfile.mkdtemp(prefix="sn-", dir="/tmp")
    kubelet, state = os.path.join(root, "kubelet"), os.path.join(root, "state")
    os.makedirs(kubelet)
    node = f"node-{uuid.uuid4().hex[:6]}"
    driver = DriverProcess(env.config_file, mode="node", workdir=os.path.join(root, "drv"), args=[
        f"--nodeid={node}", f"--kubelet-dir={kubelet}", f"--state-dir={state}", "--client-mount-timeout=5s"])
    os.makedirs(driver.workdir)
    try:
        yield driver.start(), kubelet, node
    finally:
        driver.stop()
        release_everything(root)
        remove_tree(root)


def secret_data(env: Env, ref: dict[str, str]) -> dict[str, str]:
    secret = env.kube.core.read_namespaced_secret(ref["name"], ref["namespace"])
    return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}


def capability(pv: dict[str, Any]) -> csi_pb2.VolumeCapability:
    # What the kubelet sends for a ReadWriteOnce filesystem PV (csi_attacher/csi_mounter).
    return Cap(mount=Cap.MountVolume(fs_type=pv["spec"]["csi"]["fsType"], mount_flags=pv["spec"].get("mountOptions", [])),
               access_mode=Cap.AccessMode(mode=Cap.AccessMode.SINGLE_NODE_WRITER))


def test_provision_attach_stage_publish_write_and_back(env: Env, start_controllers: StartControllers,
                                                       node_plugin: tuple[DriverProcess, str, str],
                                                       kube_namespace: str) -> None:
    start_controllers()
    node_driver, kubelet, node = node_plugin
    kube, ceph, prefix = env.kube, env.ceph, new_prefix()
    storage_class = kube.create_storage_class(ceph, env.secret, prefix=prefix)
    uid = kube.create_pvc(kube_namespace, "data", storage_class, size="64Mi")["metadata"]["uid"]
    wait_for("Bound", lambda: ((kube.pvc(kube_namespace, "data") or {}).get("status") or {}).get("phase") == "Bound")
    pv = kube.pv(f"pvc-{uid}") or {}
    kube.create_node(node)
    kube.create_pod(kube_namespace, "app", node, "data")
    wait_for("attached", lambda: [va for va in kube.attachments()
                                  if va["spec"]["source"].get("persistentVolumeName") == f"pvc-{uid}"
                                  and (va.get("status") or {}).get("attached")])

    csi = pv["spec"]["csi"]
    staging = os.path.join(kubelet, "plugins", "kubernetes.io", "csi", "rbd.csi.ceph.com", "staging", f"pvc-{uid}")
    target = os.path.join(kubelet, "pods", "pod-uid", "volumes", "kubernetes.io~csi", f"pvc-{uid}", "mount")
    os.makedirs(staging)
    os.makedirs(os.path.dirname(target))
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=csi["volumeHandle"], staging_target_path=staging, volume_capability=capability(pv),
        secrets=secret_data(env, csi["nodeStageSecretRef"]), volume_context=csi["volumeAttributes"])
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id=csi["volumeHandle"], staging_target_path=staging, target_path=target,
        volume_capability=capability(pv), volume_context=csi["volumeAttributes"])
    unpublish = csi_pb2.NodeUnpublishVolumeRequest(volume_id=csi["volumeHandle"], target_path=target)
    unstage = csi_pb2.NodeUnstageVolumeRequest(volume_id=csi["volumeHandle"], staging_target_path=staging)

    node_driver.node.NodeStageVolume(stage, timeout=120)
    node_driver.node.NodePublishVolume(publish, timeout=60)
    with open(os.path.join(target, "hello.txt"), "w") as handle:
        handle.write("written through the provisioned PV")
    node_driver.node.NodeUnpublishVolume(unpublish, timeout=60)
    node_driver.node.NodeUnstageVolume(unstage, timeout=120)
    node_driver.node.NodeStageVolume(stage, timeout=120)
    node_driver.node.NodePublishVolume(publish, timeout=60)
    with open(os.path.join(target, "hello.txt")) as handle:
        assert handle.read() == "written through the provisioned PV"
    node_driver.node.NodeUnpublishVolume(unpublish, timeout=60)
    node_driver.node.NodeUnstageVolume(unstage, timeout=120)
    assert not mounts_under(kubelet)

    kube.delete_pod(kube_namespace, "app")
    wait_for("detached", lambda: not [va for va in kube.attachments()
                                      if va["spec"]["source"].get("persistentVolumeName") == f"pvc-{uid}"])
    kube.delete_pvc(kube_namespace, "data")
    wait_for("the PV to be deleted", lambda: kube.pv(f"pvc-{uid}") is None)
    wait_for("the image to be deleted", lambda: not images_with(ceph, prefix))
