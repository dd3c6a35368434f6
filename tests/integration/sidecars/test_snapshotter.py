"""The embedded snapshotter with the upstream snapshot-controller and CRDs (built from the
external-snapshotter Go module by tests/controlplane/snapshotter_build.sh) on the real
apiserver, with real Ceph: VolumeSnapshot → ready; a claim restored from it and a claim cloned
from the source read back the data; the source claim is protected while it is cloned; deleting
the VolumeSnapshot deletes the RBD snapshot; a pre-provisioned content is imported."""
from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
import rados
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.volumes.snapshots import CREATED, SOURCE_VOLUME_ID
from cephcsi.volumes.sources import FINISHED_SIZE
from tests.controlplane import snapshot_crds
from tests.controlplane.snapshot_crds import GROUP, VERSION, snapshotter_build
from tests.integration.controller.pool_state import admin_ioctx
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import DRIVER, new_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]

CLONE_FINALIZER = "provisioner.storage.kubernetes.io/cloning-protection"


@pytest.fixture(scope="module")
def snapshot_controller(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The snapshot CRDs installed and the upstream snapshot-controller running. The CRDs stay:
    objects a failed test leaves keep finalizers that nothing removes once the controller is
    gone, which would hold up their deletion."""
    out = snapshotter_build()
    snapshot_crds.install(env.kube.client, [], out)
    log = open(tmp_path_factory.mktemp("snapctl") / "snapshot-controller.log", "wb")
    process = subprocess.Popen([str(out / "bin" / "snapshot-controller"), f"--kubeconfig={env.plane.kubeconfig}",
                                "--leader-election=false", "--retry-interval-start=200ms", "--retry-interval-max=5s",
                                "--v=4"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


class Snapshots:
    def __init__(self, env: Env) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(env.kube.client)

    def create_class(self, secret: tuple[str, str], policy: str = "Delete") -> str:
        name = f"vsc-{uuid.uuid4().hex[:8]}"
        self.custom.create_cluster_custom_object(GROUP, VERSION, "volumesnapshotclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "VolumeSnapshotClass", "metadata": {"name": name},
            "driver": DRIVER, "deletionPolicy": policy,
            "parameters": {"csi.storage.k8s.io/snapshotter-secret-name": secret[1],
                           "csi.storage.k8s.io/snapshotter-secret-namespace": secret[0]}})
        return name

    def create_snapshot(self, namespace: str, name: str, source: dict[str, str], class_name: str = "") -> None:
        spec: dict[str, Any] = {"source": source}
        if class_name:
            spec["volumeSnapshotClassName"] = class_name
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "VolumeSnapshot", "metadata": {"name": name}, "spec": spec})

    def snapshot(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", name))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return {}
            raise

    def content(self, name: str) -> dict[str, Any]:
        try:
            return dict(self.custom.get_cluster_custom_object(GROUP, VERSION, "volumesnapshotcontents", name))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return {}
            raise

    def delete_snapshot(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", name)


def image_of(env: Env, namespace: str, claim: str) -> str:
    volume = (env.kube.pvc(namespace, claim) or {})["spec"]["volumeName"]
    return str((env.kube.pv(volume) or {})["spec"]["csi"]["volumeAttributes"]["imageName"])


def bound(env: Env, namespace: str, name: str, storage_class: str, **spec: Any) -> str:
    env.kube.create_pvc(namespace, name, storage_class, **spec)
    wait_for(f"{name} Bound", lambda: ((env.kube.pvc(namespace, name) or {}).get("status") or {}).get("phase") == "Bound")
    return image_of(env, namespace, name)


def write(env: Env, image: str, data: bytes) -> None:
    with admin_ioctx(env.ceph) as io, rbd.Image(io, image) as handle:
        handle.write(data, 0)


def read(env: Env, image: str, length: int) -> bytes:
    with admin_ioctx(env.ceph) as io, rbd.Image(io, image, read_only=True) as handle:
        return bytes(handle.read(0, length))


def test_snapshot_restore_clone_and_delete(env: Env, start_controllers: StartControllers, snapshot_controller: None,
                                           kube_namespace: str) -> None:
    start_controllers()
    api = Snapshots(env)
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix())
    snapshot_class = api.create_class(env.secret)
    ns = kube_namespace
    source_image = bound(env, ns, "src", storage_class)
    data = uuid.uuid4().bytes * 256
    write(env, source_image, data)

    api.create_snapshot(ns, "snap", {"persistentVolumeClaimName": "src"}, snapshot_class)
    wait_for("VolumeSnapshot ready", lambda: (api.snapshot(ns, "snap").get("status") or {}).get("readyToUse") is True)
    status = api.snapshot(ns, "snap")["status"]
    content = api.content(status["boundVolumeSnapshotContentName"])
    handle = content["status"]["snapshotHandle"]
    assert content["status"]["restoreSize"] == 8 << 20 and content["status"]["creationTime"] > 0
    assert status["restoreSize"] == "8Mi"
    assert "snapshot.storage.kubernetes.io/volumesnapshot-being-created" not in content["metadata"].get("annotations", {})
    snapshot_uuid = handle[-36:]
    assert env.ceph.omap(f"csi.snap.{snapshot_uuid}")["csi.snapname"] == f"snapshot-{api.snapshot(ns, 'snap')['metadata']['uid']}"

    restored = bound(env, ns, "restored", storage_class,
                     dataSource={"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": "snap"})
    assert read(env, restored, len(data)) == data
    clone = bound(env, ns, "clone", storage_class, dataSource={"kind": "PersistentVolumeClaim", "name": "src"})
    assert read(env, clone, len(data)) == data
    assert CLONE_FINALIZER in (env.kube.pvc(ns, "src") or {})["metadata"]["finalizers"]

    env.kube.delete_pvc(ns, "src")
    wait_for("source claim gone (cloning finalizer released)", lambda: env.kube.pvc(ns, "src") is None)
    assert read(env, clone, len(data)) == data, "a clone outlives its source"
    api.delete_snapshot(ns, "snap")
    wait_for("content deleted", lambda: not api.content(status["boundVolumeSnapshotContentName"]), timeout=90)
    assert env.ceph.omap(f"csi.snap.{snapshot_uuid}") == {}, "the RBD snapshot's journal entry is gone"
    assert read(env, restored, len(data)) == data, "a restore outlives its snapshot"
    for claim in ("restored", "clone"):
        env.kube.delete_pvc(ns, claim)
    wait_for("claims gone", lambda: not env.kube.pvcs(ns), timeout=90)


@pytest.mark.parametrize("made_by", ["cephcsi", "ceph-csi"])
def test_pre_provisioned_content_is_imported(env: Env, start_controllers: StartControllers, snapshot_controller: None,
                                            kube_namespace: str, made_by: str) -> None:
    """A content naming an existing snapshot (here made through CSI) gets its status from
    ListSnapshots; with policy Delete, deleting the VolumeSnapshot deletes the snapshot. A backup
    tool's restore does this with the handles it saved, also of snapshots ceph-csi made before
    the switch: their records name only the source's image (what cephcsi adds is taken away)."""
    controller = start_controllers()[0]
    api = Snapshots(env)
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix())
    snapshot_class = api.create_class(env.secret)
    ns = kube_namespace
    bound(env, ns, "src", storage_class)
    volume_id = (env.kube.pv((env.kube.pvc(ns, "src") or {})["spec"]["volumeName"]) or {})["spec"]["csi"]["volumeHandle"]
    made = controller.controller.CreateSnapshot(csi_pb2.CreateSnapshotRequest(
        name=f"static-{uuid.uuid4()}", source_volume_id=volume_id, secrets=env.ceph.secrets), timeout=60).snapshot
    if made_by == "ceph-csi":
        with admin_ioctx(env.ceph) as io, rados.WriteOpCtx() as op:
            io.remove_omap_keys(op, (SOURCE_VOLUME_ID, CREATED, FINISHED_SIZE))
            io.operate_write_op(op, f"csi.snap.{made.snapshot_id[-36:]}")
    content_name = f"static-{uuid.uuid4().hex[:8]}"
    api.custom.create_cluster_custom_object(GROUP, VERSION, "volumesnapshotcontents", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name, "annotations": {
            "snapshot.storage.kubernetes.io/deletion-secret-name": env.secret[1],
            "snapshot.storage.kubernetes.io/deletion-secret-namespace": env.secret[0]}},
        "spec": {"driver": DRIVER, "deletionPolicy": "Delete", "volumeSnapshotClassName": snapshot_class,
                 "source": {"snapshotHandle": made.snapshot_id},
                 "volumeSnapshotRef": {"name": "imported", "namespace": ns}}})
    api.create_snapshot(ns, "imported", {"volumeSnapshotContentName": content_name})
    wait_for("imported snapshot ready", lambda: (api.snapshot(ns, "imported").get("status") or {}).get("readyToUse") is True)
    assert api.content(content_name)["status"]["snapshotHandle"] == made.snapshot_id
    assert api.content(content_name)["status"]["restoreSize"] == made.size_bytes
    api.delete_snapshot(ns, "imported")
    wait_for("content deleted", lambda: not api.content(content_name), timeout=90)
    assert env.ceph.omap(f"csi.snap.{made.snapshot_id[-36:]}") == {}
    env.kube.delete_pvc(ns, "src")
    wait_for("claims gone", lambda: not env.kube.pvcs(ns), timeout=90)
