"""The embedded group snapshotter with the upstream snapshot-controller (v8.7.0, group snapshots
on: their CRDs exist when it starts) on the real apiserver, with real Ceph: a VolumeGroupSnapshot
selecting two bound claims by label becomes ready through CreateVolumeGroupSnapshot, the
snapshot-controller makes a ready VolumeSnapshot per member from the content's status (one
restored to check it is an ordinary snapshot), and deleting the VolumeGroupSnapshot runs
DeleteVolumeGroupSnapshot: the group journal and the snapshot images are gone."""
from __future__ import annotations

import uuid
from typing import Any

import kubernetes.client
import pytest

from tests.controlplane.snapshot_crds import GROUP, GROUP_SNAPSHOT_GROUP, VERSION
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.controller.test_group_snapshots import groups_left
from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import DRIVER, new_prefix, wait_for
from tests.integration.sidecars.test_snapshotter import bound, image_of, read, snapshot_controller, write

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]

__all__ = ["snapshot_controller"]  # the module fixture (CRDs + snapshot-controller), shared

BEING_CREATED = "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-created"
FINALIZER = "groupsnapshot.storage.kubernetes.io/volumegroupsnapshotcontent-bound-protection"


class Groups:
    def __init__(self, env: Env) -> None:
        self.custom = kubernetes.client.CustomObjectsApi(env.kube.client)

    def get(self, plural: str, name: str, namespace: str = "", group: str = GROUP_SNAPSHOT_GROUP) -> dict[str, Any]:
        try:
            if namespace:
                return dict(self.custom.get_namespaced_custom_object(group, VERSION, namespace, plural, name))
            return dict(self.custom.get_cluster_custom_object(group, VERSION, plural, name))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return {}
            raise


def test_group_snapshot_ready_members_restorable_and_deleted(
        env: Env, start_controllers: StartControllers, snapshot_controller: None, kube_namespace: str) -> None:
    start_controllers()
    api = Groups(env)
    ns = kube_namespace
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=new_prefix())
    label = {"app": f"db-{uuid.uuid4().hex[:6]}"}
    images, data = {}, {}
    for claim in ("wal", "data"):
        env.kube.core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": claim, "labels": label}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}},
            "storageClassName": storage_class}})
    for claim in ("wal", "data"):
        wait_for(f"{claim} Bound", lambda: ((env.kube.pvc(ns, claim) or {}).get("status") or {}).get("phase") == "Bound")
        images[claim] = image_of(env, ns, claim)
        data[claim] = uuid.uuid4().bytes * 64
        write(env, images[claim], data[claim])
    baseline = read_pool(env.ceph)

    class_name = f"vgsc-{uuid.uuid4().hex[:8]}"
    api.custom.create_cluster_custom_object(GROUP_SNAPSHOT_GROUP, VERSION, "volumegroupsnapshotclasses", {
        "apiVersion": f"{GROUP_SNAPSHOT_GROUP}/{VERSION}", "kind": "VolumeGroupSnapshotClass",
        "metadata": {"name": class_name}, "driver": DRIVER, "deletionPolicy": "Delete",
        "parameters": {"clusterID": env.ceph.parameters["clusterID"],
                       "csi.storage.k8s.io/group-snapshotter-secret-name": env.secret[1],
                       "csi.storage.k8s.io/group-snapshotter-secret-namespace": env.secret[0]}})
    try:
        api.custom.create_namespaced_custom_object(GROUP_SNAPSHOT_GROUP, VERSION, ns, "volumegroupsnapshots", {
            "apiVersion": f"{GROUP_SNAPSHOT_GROUP}/{VERSION}", "kind": "VolumeGroupSnapshot",
            "metadata": {"name": "backup"},
            "spec": {"volumeGroupSnapshotClassName": class_name, "source": {"selector": {"matchLabels": label}}}})
        wait_for("VolumeGroupSnapshot ready", lambda: (api.get("volumegroupsnapshots", "backup", ns).get("status")
                                                        or {}).get("readyToUse") is True)
        group = api.get("volumegroupsnapshots", "backup", ns)
        content_name = group["status"]["boundVolumeGroupSnapshotContentName"]
        content = api.get("volumegroupsnapshotcontents", content_name)
        status = content["status"]
        handle = status["volumeGroupSnapshotHandle"]
        assert BEING_CREATED not in (content["metadata"].get("annotations") or {})
        assert FINALIZER in content["metadata"]["finalizers"]
        volume_handles = {(env.kube.pv(v["spec"]["volumeName"]) or {})["spec"]["csi"]["volumeHandle"]
                          for v in (env.kube.pvc(ns, c) or {} for c in ("wal", "data"))}
        members = status["volumeSnapshotInfoList"]
        assert {m["volumeHandle"] for m in members} == volume_handles
        assert all(m["readyToUse"] and m["restoreSize"] == 8 << 20 for m in members)
        # The group journal holds the CSI name csi-snapshotter gives: groupsnapshot-<uid>.
        journal_key = f"csi.volume.group.groupsnapshot-{group['metadata']['uid']}"
        assert journal_key in groups_left(env.ceph)[1]

        # The snapshot-controller made a ready VolumeSnapshot per member from that status; each
        # is an ordinary snapshot (a claim restored from one reads the member's data).
        def members_ready() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = api.custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, "volumesnapshots")["items"]
            ready = len(items) == 2 and all((s.get("status") or {}).get("readyToUse") is True for s in items)
            return items if ready else []

        names = {}
        for snapshot in wait_for("member VolumeSnapshots ready", members_ready):
            names[snapshot["spec"]["source"]["persistentVolumeClaimName"]] = snapshot["metadata"]["name"]
            member_content = api.get("volumesnapshotcontents", snapshot["status"]["boundVolumeSnapshotContentName"],
                                     group=GROUP)
            assert member_content["status"]["volumeGroupSnapshotHandle"] == handle
            assert member_content["status"]["snapshotHandle"] in {m["snapshotHandle"] for m in members}
        assert sorted(names) == ["data", "wal"]
        restored = bound(env, ns, "restored-wal", storage_class,
                         dataSource={"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": names["wal"]})
        assert read(env, restored, len(data["wal"])) == data["wal"]
        env.kube.delete_pvc(ns, "restored-wal")
        wait_for("restored claim gone", lambda: env.kube.pvc(ns, "restored-wal") is None, timeout=60)

        api.custom.delete_namespaced_custom_object(GROUP_SNAPSHOT_GROUP, VERSION, ns, "volumegroupsnapshots", "backup")
        wait_for("VolumeGroupSnapshot, its content and members gone", lambda: not api.get(
            "volumegroupsnapshots", "backup", ns) and not api.get("volumegroupsnapshotcontents", content_name)
            and not api.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "volumesnapshots")["items"], timeout=90)
        # DeleteVolumeGroupSnapshot ran before the finalizer went: the group journal entry is
        # gone, and the pool is as before the group (member snapshot images and their records).
        assert journal_key not in groups_left(env.ceph)[1]
        assert wait_for_pool(env.ceph, baseline) == baseline
        assert read(env, images["data"], len(data["data"])) == data["data"], "the sources outlive the group"
    finally:
        api.custom.delete_cluster_custom_object(GROUP_SNAPSHOT_GROUP, VERSION, "volumegroupsnapshotclasses", class_name)
    for claim in ("wal", "data"):
        env.kube.delete_pvc(ns, claim)
    wait_for("claims gone", lambda: not env.kube.pvcs(ns), timeout=90)
