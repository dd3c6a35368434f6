"""Snapshot and restore on the real node: a pod writes, a VolumeSnapshot of its claim becomes
readyToUse, a claim restored from it binds, and a second pod reads the data back.

The snapshot CRDs and the upstream snapshot-controller (kubernetes-csi/external-snapshotter,
built and cached by tests/controlplane/snapshotter_build.sh) are cluster-wide add-ons a user
installs once (docs/snapshots.md); here the controller runs on the host against the node's
apiserver, as tests/integration/sidecars/test_snapshotter.py runs it. cephcsi's controller
notices the CRDs by itself (it checks discovery while they are missing) and starts its
embedded snapshotter. The VolumeSnapshotClass is deploy/examples/snapshots/snapshotclass.yaml
with its placeholder (clusterID) filled in.
"""
from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from tests.e2e.env import DEPLOY, IMAGE, STORAGE_CLASS, E2EEnv
from tests.e2e.kube import image_name, wait_for
from tests.e2e.test_volumes import IDLE, delete_claim, provision

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420, func_only=True)]

BUILD = Path(__file__).resolve().parents[1] / "controlplane" / "snapshotter_build.sh"
GROUP, VERSION = "snapshot.storage.k8s.io", "v1"
SNAPSHOT_CLASS = "csi-rbd-snapclass"
READY_TIMEOUT = 180.0
"""CRDs noticed by the controller (discovery every 30 s) + CreateSnapshot on a shared node."""


def _established(extensions: kubernetes.client.ApiextensionsV1Api, name: str) -> bool:
    conditions = extensions.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _snapshots(custom: kubernetes.client.CustomObjectsApi) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = custom.list_cluster_custom_object(GROUP, VERSION, "volumesnapshots")["items"]
    return items


@pytest.fixture(scope="module")
def snapshot_class(e2e: E2EEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The snapshot CRDs, the snapshot-controller running and the example VolumeSnapshotClass;
    its name. The controller is stopped only after every VolumeSnapshot is gone (it removes
    their finalizers; without it the test namespaces could never be deleted)."""
    out = Path(subprocess.run([str(BUILD)], check=True, capture_output=True, text=True,
                              timeout=3600).stdout.strip().splitlines()[-1])
    extensions = kubernetes.client.ApiextensionsV1Api(e2e.kube.api)
    for path in sorted((out / "crd").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        try:
            extensions.create_custom_resource_definition(body)
        except kubernetes.client.ApiException as error:
            if error.status != 409:
                raise
        name = body["metadata"]["name"]
        wait_for(f"CRD {name} established", lambda: _established(extensions, name), timeout=60)
    log_path = tmp_path_factory.mktemp("snapctl") / "snapshot-controller.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([str(out / "bin" / "snapshot-controller"), f"--kubeconfig={e2e.node.kubeconfig}",
                                    "--leader-election=false", "--retry-interval-start=500ms",
                                    "--retry-interval-max=5s", "--v=2"], stdout=log, stderr=subprocess.STDOUT)
    custom = kubernetes.client.CustomObjectsApi(e2e.kube.api)
    try:
        docs = list(yaml.safe_load_all((DEPLOY / "examples" / "snapshots" / "snapshotclass.yaml").read_text()))
        snapclass = next(d for d in docs if d["kind"] == "VolumeSnapshotClass")
        snapclass["parameters"]["clusterID"] = e2e.ceph.cluster_id
        custom.create_cluster_custom_object(GROUP, VERSION, "volumesnapshotclasses", snapclass)
        yield str(snapclass["metadata"]["name"])
    finally:
        try:
            wait_for("every VolumeSnapshot deleted", lambda: not _snapshots(custom), timeout=120)
        finally:
            process.terminate()
            process.wait(timeout=30)


def snapshot(custom: kubernetes.client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    try:
        return dict(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", name))
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return {}
        raise


def content(custom: kubernetes.client.CustomObjectsApi, name: str) -> dict[str, Any]:
    try:
        return dict(custom.get_cluster_custom_object(GROUP, VERSION, "volumesnapshotcontents", name))
    except kubernetes.client.ApiException as error:
        if error.status == 404:
            return {}
        raise


def test_snapshot_and_restore(e2e: E2EEnv, namespace: str, snapshot_class: str) -> None:
    kube = e2e.kube
    custom = kubernetes.client.CustomObjectsApi(kube.api)
    token = uuid.uuid4().hex
    source = provision(e2e, namespace, "src")

    kube.create_pod(namespace, "writer", IMAGE,
                    f"echo {token} > /data/token && head -c 4194304 /dev/urandom > /data/blob && "
                    f"sha256sum /data/blob > /data/blob.sum && sync && {IDLE}", "src")
    kube.wait_pod_ready(namespace, "writer")
    kube.wait_written(namespace, "writer", "/data/blob.sum")
    kube.exec_in(namespace, "writer", "sync")

    # A snapshot of the claim while its pod runs (crash-consistent, after the pod's sync).
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VolumeSnapshot", "metadata": {"name": "snap"},
        "spec": {"volumeSnapshotClassName": snapshot_class, "source": {"persistentVolumeClaimName": "src"}}})
    wait_for("VolumeSnapshot readyToUse",
             lambda: (snapshot(custom, namespace, "snap").get("status") or {}).get("readyToUse") is True,
             READY_TIMEOUT, interval=1.0,
             explain=lambda: f"{snapshot(custom, namespace, 'snap').get('status')}\n{kube.events(namespace, 'snap')}")
    status = snapshot(custom, namespace, "snap")["status"]
    assert status["restoreSize"] == "64Mi"
    content_name = status["boundVolumeSnapshotContentName"]
    handle = content(custom, content_name)["status"]["snapshotHandle"]
    assert f"csi.snap.{handle[-36:]}" in e2e.ceph.objects(), "the snapshot's journal record is in Ceph"
    kube.delete_pod(namespace, "writer")

    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "restored"},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "64Mi"}},
                 "dataSource": {"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": "snap"}}})
    restored = kube.wait_bound(namespace, "restored", timeout=120)
    assert image_name(restored) != image_name(source)

    kube.create_pod(namespace, "reader", IMAGE, IDLE, "restored")
    kube.wait_pod_ready(namespace, "reader")
    assert kube.exec_in(namespace, "reader", "cat /data/token").strip() == token
    kube.exec_in(namespace, "reader", "sha256sum -c /data/blob.sum")  # exit 1 (kubectl fails) on a mismatch
    kube.delete_pod(namespace, "reader")

    # Deleting the VolumeSnapshot (policy Delete) deletes its content and the RBD snapshot;
    # the restored volume outlives it.
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", "snap")
    wait_for("VolumeSnapshot and its content deleted",
             lambda: not snapshot(custom, namespace, "snap") and not content(custom, content_name), timeout=120,
             explain=lambda: repr(content(custom, content_name).get("status")))
    wait_for("the snapshot's journal record gone", lambda: f"csi.snap.{handle[-36:]}" not in e2e.ceph.objects(),
             timeout=60)
    delete_claim(e2e, namespace, "restored", restored)
    delete_claim(e2e, namespace, "src", source)


def test_clone_of_a_claim_into_a_larger_one(e2e: E2EEnv, namespace: str) -> None:
    """PVC → PVC clone (no snapshot class involved): the clone binds while the source's pod
    runs, carries the source's data, and is larger than the source — its ext4 is grown when
    the clone is first staged (before the mount: no capability needed)."""
    kube = e2e.kube
    token = uuid.uuid4().hex
    source = provision(e2e, namespace, "src")
    kube.create_pod(namespace, "writer", IMAGE, f"echo {token} > /data/token && sync && {IDLE}", "src")
    kube.wait_pod_ready(namespace, "writer")
    kube.wait_written(namespace, "writer", "/data/token")
    kube.exec_in(namespace, "writer", "sync")

    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "clone"},
        "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "128Mi"}},
                 "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}})
    clone = kube.wait_bound(namespace, "clone", timeout=120)
    assert image_name(clone) != image_name(source)
    assert clone["spec"]["capacity"]["storage"] == "128Mi"
    # As external-provisioner: the source claim keeps its clone protection until it is itself
    # deleted (then released, since no clone of it is pending: delete_claim below waits for it).
    finalizers = (kube.pvc(namespace, "src") or {}).get("metadata", {}).get("finalizers") or []
    assert "provisioner.storage.kubernetes.io/cloning-protection" in finalizers, finalizers
    kube.delete_pod(namespace, "writer")

    kube.create_pod(namespace, "reader", IMAGE, IDLE, "clone")
    kube.wait_pod_ready(namespace, "reader")
    assert kube.exec_in(namespace, "reader", "cat /data/token").strip() == token
    size = int(kube.exec_in(namespace, "reader", "df -B1 --output=size /data | tail -n 1").strip())
    assert size > 96 * (1 << 20), f"the clone's filesystem was not grown to its claim: {size} bytes"
    kube.delete_pod(namespace, "reader")
    delete_claim(e2e, namespace, "clone", clone)
    delete_claim(e2e, namespace, "src", source)
