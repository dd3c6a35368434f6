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
from tests.e2e.snapshot_addon import GROUP, VERSION, example_snapshot_class, start_snapshot_addon
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


GROUP_SNAPSHOTS = "groupsnapshot.storage.k8s.io"


def two_claim_pod(namespace: str, name: str, claims: dict[str, str], script: str) -> dict[str, Any]:
    """A pod with claim `claims[mount]` at /<mount> for each mount: a two-claim workload."""
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {
        "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script],
                        "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                        "volumeMounts": [{"name": mount, "mountPath": f"/{mount}"} for mount in claims]}],
        "volumes": [{"name": mount, "persistentVolumeClaim": {"claimName": claim}} for mount, claim in claims.items()],
        "terminationGracePeriodSeconds": 5, "enableServiceLinks": False, "automountServiceAccountToken": False}}


def test_group_snapshot_of_a_two_claim_workload_restored_into_new_claims(
        e2e: E2EEnv, namespace: str, snapshot_class: str) -> None:
    """A VolumeGroupSnapshot (groupsnapshot.storage.k8s.io/v1) of a pod's two claims through the
    real snapshot-controller and the embedded group snapshotter: ready, one member VolumeSnapshot
    per claim, each restored into a new claim that a second pod reads the data of its source from;
    deleting the group snapshot (Delete policy) removes its members' snapshots from Ceph."""
    kube = e2e.kube
    custom = kubernetes.client.CustomObjectsApi(kube.api)
    label = {"app": f"db-{uuid.uuid4().hex[:6]}"}
    tokens = {"wal": uuid.uuid4().hex, "data": uuid.uuid4().hex}
    sources = {claim: provision(e2e, namespace, claim) for claim in tokens}
    for claim in tokens:
        kube.core.patch_namespaced_persistent_volume_claim(claim, namespace, {"metadata": {"labels": label}})
    writes = " && ".join(f"echo {token} > /{claim}/token" for claim, token in tokens.items())
    kube.core.create_namespaced_pod(namespace, two_claim_pod(namespace, "db", {c: c for c in tokens},
                                                             f"{writes} && sync && {IDLE}"))
    kube.wait_pod_ready(namespace, "db")
    kube.wait_written(namespace, "db", "/data/token")
    kube.exec_in(namespace, "db", "sync")

    class_name = f"vgsc-{uuid.uuid4().hex[:6]}"
    secret = {k: v for k, v in example_snapshot_class(e2e.ceph.cluster_id)["parameters"].items()
              if k.startswith("csi.storage.k8s.io/snapshotter-secret-")}
    custom.create_cluster_custom_object(GROUP_SNAPSHOTS, VERSION, "volumegroupsnapshotclasses", {
        "apiVersion": f"{GROUP_SNAPSHOTS}/{VERSION}", "kind": "VolumeGroupSnapshotClass",
        "metadata": {"name": class_name}, "driver": "rbd.csi.ceph.com", "deletionPolicy": "Delete",
        "parameters": {"clusterID": e2e.ceph.cluster_id,
                       **{k.replace("snapshotter-secret", "group-snapshotter-secret"): v for k, v in secret.items()}}})
    try:
        custom.create_namespaced_custom_object(GROUP_SNAPSHOTS, VERSION, namespace, "volumegroupsnapshots", {
            "apiVersion": f"{GROUP_SNAPSHOTS}/{VERSION}", "kind": "VolumeGroupSnapshot", "metadata": {"name": "backup"},
            "spec": {"volumeGroupSnapshotClassName": class_name, "source": {"selector": {"matchLabels": label}}}})

        def group() -> dict[str, Any]:
            try:
                return dict(custom.get_namespaced_custom_object(GROUP_SNAPSHOTS, VERSION, namespace,
                                                                "volumegroupsnapshots", "backup"))
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return {}
                raise

        wait_for("VolumeGroupSnapshot readyToUse", lambda: (group().get("status") or {}).get("readyToUse") is True,
                 READY_TIMEOUT, interval=1.0, explain=lambda: f"{group().get('status')}\n{kube.events(namespace, 'backup')}")
        kube.delete_pod(namespace, "db")

        def members() -> dict[str, str]:
            items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots")["items"]
            ready = {s["spec"]["source"]["persistentVolumeClaimName"]: s["metadata"]["name"] for s in items
                     if (s.get("status") or {}).get("readyToUse") is True}
            return ready if sorted(ready) == sorted(tokens) else {}

        member_snapshots = wait_for("one ready member VolumeSnapshot per claim", members, 60, interval=1.0)
        handles = [content(custom, snapshot(custom, namespace, name)["status"]["boundVolumeSnapshotContentName"])
                   ["status"]["snapshotHandle"] for name in member_snapshots.values()]
        assert all(f"csi.snap.{h[-36:]}" in e2e.ceph.objects() for h in handles), "member snapshot records in Ceph"

        restored = {}
        for claim, name in member_snapshots.items():
            kube.core.create_namespaced_persistent_volume_claim(namespace, {
                "metadata": {"name": f"restored-{claim}"},
                "spec": {"storageClassName": STORAGE_CLASS, "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "64Mi"}},
                         "dataSource": {"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": name}}})
        for claim in tokens:
            restored[claim] = kube.wait_bound(namespace, f"restored-{claim}", timeout=120)
        kube.core.create_namespaced_pod(namespace, two_claim_pod(
            namespace, "reader", {c: f"restored-{c}" for c in tokens}, IDLE))
        kube.wait_pod_ready(namespace, "reader")
        for claim, token in tokens.items():
            assert kube.exec_in(namespace, "reader", f"cat /{claim}/token").strip() == token, claim
        kube.delete_pod(namespace, "reader")

        custom.delete_namespaced_custom_object(GROUP_SNAPSHOTS, VERSION, namespace, "volumegroupsnapshots", "backup")
        wait_for("the group snapshot and its members gone", lambda: not group() and not custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "volumesnapshots")["items"], timeout=120)
        wait_for("the member snapshots' records gone from Ceph",
                 lambda: not any(f"csi.snap.{h[-36:]}" in e2e.ceph.objects() for h in handles), timeout=60)
    finally:
        custom.delete_cluster_custom_object(GROUP_SNAPSHOTS, VERSION, "volumegroupsnapshotclasses", class_name)
    for claim in tokens:
        if claim in restored:
            delete_claim(e2e, namespace, f"restored-{claim}", restored[claim])
        delete_claim(e2e, namespace, claim, sources[claim])
