"""Snapshot and restore on the real node: a pod writes, a VolumeSnapshot of its claim becomes
readyToUse, a claim restored from it binds, and a second pod reads the data back.

The snapshot CRDs, the upstream snapshot-controller and the example VolumeSnapshotClass are the
cluster-wide add-on of tests/e2e/snapshot_addon.py.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from tests.e2e.env import IMAGE, STORAGE_CLASS, E2EEnv
from tests.e2e.kube import image_name, wait_for
from tests.e2e.snapshot_addon import GROUP, VERSION, start_snapshot_addon
from tests.e2e.test_volumes import IDLE, delete_claim, provision

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420, func_only=True)]

READY_TIMEOUT = 180.0
"""CRDs noticed by the controller (discovery every 30 s) + CreateSnapshot on a shared node."""


@pytest.fixture(scope="module")
def snapshot_class(e2e: E2EEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The snapshot add-on running (tests/e2e/snapshot_addon.py); the VolumeSnapshotClass's name."""
    addon = start_snapshot_addon(e2e, tmp_path_factory.mktemp("snapctl") / "snapshot-controller.log")
    try:
        yield addon.class_name
    finally:
        addon.stop()


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
