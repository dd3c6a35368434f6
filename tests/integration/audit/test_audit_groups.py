"""`cephcsi audit` over the group snapshot journal on a real pool: group snapshot creates killed at
the driver's failpoints and then abandoned (the CO gave up), an RBD group named like the
driver's with no record, and member snapshots of a group whose journal entry is gone. Each is
reported; `--repair` removes only the RBD group (its images untouched), and what remains is
settled by the driver's own retry and DeleteVolumeGroupSnapshot."""
from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.audit import scan_snaps
from cephcsi.ceph import omap
from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import admin_namespace, new_uuid, run_audit
from tests.integration.controller.helpers import MiB, create_request, image_of, until_ok
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

GROUP_KINDS = {"unfinished-group-snapshot", "orphan-rbd-group", "orphan-group-member"}


def group_request(cluster: CephTestCluster, volume_ids: list[str]) -> csi_pb2.CreateVolumeGroupSnapshotRequest:
    return csi_pb2.CreateVolumeGroupSnapshotRequest(name=f"groupsnapshot-{uuidlib.uuid4()}",
                                                    source_volume_ids=volume_ids, secrets=cluster.secrets)


def by_kind(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["kind"], f["subject"]): f for f in doc["findings"]}


def test_audit_reports_abandoned_group_creates_and_removes_only_an_orphan_rbd_group(
        ceph_cluster: CephTestCluster, drivers: tuple[str, str, Callable[..., DriverProcess]]) -> None:
    namespace, config, start = drivers
    healthy = start()
    c, groups = healthy.controller, csi_pb2_grpc.GroupControllerStub(healthy.channel)

    def killed_at(point: str, request: csi_pb2.CreateVolumeGroupSnapshotRequest) -> None:
        doomed = start({"CEPHCSI_FAILPOINTS": point})
        with pytest.raises(grpc.RpcError):
            csi_pb2_grpc.GroupControllerStub(doomed.channel).CreateVolumeGroupSnapshot(request, timeout=60)
        assert doomed.process is not None and doomed.process.wait(timeout=30) == -9, point

    with admin_namespace(ceph_cluster, namespace) as io:
        volumes = [c.CreateVolume(create_request(ceph_cluster, size=4 * MiB), timeout=60).volume.volume_id
                   for _ in range(5)]
        images = [image_of(v) for v in volumes]
        # A clean pool with a finished group snapshot reports nothing about groups.
        kept = groups.CreateVolumeGroupSnapshot(group_request(ceph_cluster, volumes[4:5]), timeout=60).group_snapshot
        code, doc, _ = run_audit(ceph_cluster, config)
        assert (code, doc["findings"]) == (0, []), doc

        # --- debris: two creates killed and abandoned, an RBD group, members of a lost group ---
        in_group = group_request(ceph_cluster, volumes[0:2])
        killed_at("group.after-rbd-group", in_group)
        recorded = group_request(ceph_cluster, volumes[2:3])
        killed_at("group.after-record", recorded)
        reserved = group_request(ceph_cluster, volumes[2:3])
        killed_at("group.after-reserve", reserved)
        lost = groups.CreateVolumeGroupSnapshot(group_request(ceph_cluster, volumes[3:4]), timeout=60).group_snapshot
        stray_group = f"csi-vol-group-{new_uuid()}"
        rbd.RBD().group_create(io, stray_group)
        rbd.Group(io, stray_group).add_image(io, images[3])
        directory = omap.read(io, "csi.groups.default") or {}
        lost_name = next(k for k, v in directory.items() if lost.group_snapshot_id.endswith(v))
        lost_uuid = directory[lost_name]
        omap.remove_keys(io, "csi.groups.default", (lost_name,))
        omap.remove_object(io, f"csi.volume.group.{lost_uuid}")
        # The killed drivers' leases lapse 2 s after their death: until then nothing is judged.
        records = [o.key for o in io.list_objects() if o.key.startswith(("csi.volume.", "csi.snap."))]
        deadline = time.monotonic() + 30
        while scan_snaps.read_leases(io, records) and time.monotonic() < deadline:
            time.sleep(0.5)

        keys = omap.read(io, "csi.groups.default") or {}
        in_group_uuid, recorded_uuid = keys[f"csi.volume.group.{in_group.name}"], keys[f"csi.volume.group.{recorded.name}"]
        code, doc, _ = run_audit(ceph_cluster, config)
        found = by_kind(doc)
        assert code == 1
        held = found[("unfinished-group-snapshot", in_group.name)]
        assert (held["journal"], held["uuid"], held["fix"]) == ("group", in_group_uuid, None)
        assert f"still holds source image(s) {', '.join(sorted(images[0:2]))}" in held["detail"]
        assert "retry" in held["why_not"]
        unfinished = found[("unfinished-group-snapshot", recorded.name)]
        assert (unfinished["uuid"], unfinished["fix"]) == (recorded_uuid, None)
        assert "1 of 1 member snapshot(s) unfinished" in unfinished["detail"]
        key = found[("dangling-key", reserved.name)]
        assert (key["journal"], key["fix"]) == ("group", "release-key")
        stray = found[("orphan-rbd-group", stray_group)]
        assert (stray["journal"], stray["fix"]) == ("group", "remove-rbd-group")
        assert images[3] in stray["detail"]
        members = [f for (kind, _), f in found.items() if kind == "orphan-group-member"]
        assert [m["name"] for m in members] == [f"{lost_name[len('csi.volume.group.'):]}-{m['uuid']}"
                                                for m in members] and len(members) == 1
        assert members[0]["fix"] is None and members[0]["journal"] == "snapshot"
        # The killed after-rbd-group create's member records wait for their images: dangling in
        # the snapshot journal, left to the group's retry or delete.
        dangling = [f for f in doc["findings"] if f["kind"] == "dangling-record"]
        assert dangling and all(f["fix"] is None and in_group.name in f["why_not"] for f in dangling), dangling
        assert {f["kind"] for f in doc["findings"]} <= GROUP_KINDS | {"dangling-record", "dangling-key"}, \
            doc["findings"]

        # --- repair: the RBD group goes (its image untouched), the key is released; no more ---
        code, doc, _ = run_audit(ceph_cluster, config, "--repair")
        outcomes = {(f["kind"], f["subject"]): f["repair"]["outcome"] for f in doc["findings"]}
        assert outcomes.pop(("orphan-rbd-group", stray_group)) == "repaired"
        assert outcomes.pop(("dangling-key", reserved.name)) == "repaired"
        assert set(outcomes.values()) == {"skipped"}
        assert f"csi.volume.group.{reserved.name}" not in (omap.read(io, "csi.groups.default") or {})
        assert stray_group not in list(rbd.RBD().group_list(io))
        with rbd.Image(io, images[3], read_only=True) as image:
            assert image.group().get("name", "") in ("", None)
        assert sorted(rbd.RBD().group_list(io)) == [f"csi-vol-group-{in_group_uuid}"]

        # --- the driver settles the rest: a retry finishes one, a delete removes the other ------
        retried = until_ok(lambda: groups.CreateVolumeGroupSnapshot(in_group, timeout=60)).group_snapshot
        assert retried.ready_to_use
        for group in (retried, kept):
            groups.DeleteVolumeGroupSnapshot(csi_pb2.DeleteVolumeGroupSnapshotRequest(
                group_snapshot_id=group.group_snapshot_id, secrets=ceph_cluster.secrets), timeout=60)
        recorded_id = retried.group_snapshot_id.replace(in_group_uuid, recorded_uuid)
        groups.DeleteVolumeGroupSnapshot(csi_pb2.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id=recorded_id, secrets=ceph_cluster.secrets), timeout=60)
        for snapshot in lost.snapshots:
            c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot.snapshot_id,
                                                           secrets=ceph_cluster.secrets), timeout=60)
        code, doc, _ = run_audit(ceph_cluster, config)
        assert doc["findings"] == [], doc["findings"]
        for volume_id in volumes:
            until_ok(lambda: c.DeleteVolume(csi_pb2.DeleteVolumeRequest(
                volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60))

