"""`cephcsi audit --kubeconfig` against a real kube-apiserver: PVs whose image is gone, images
whose PV is gone, and the orphan-image repair, which must never touch an image a PV names or
a client uses, and must leave what it moves restorable in the trash. Likewise for snapshots:
VolumeSnapshotContents whose snapshot is gone, snapshots no content names, no repair of a
snapshot a content names, and an API server without the snapshot CRDs."""
from __future__ import annotations

import functools
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import rbd

from cephcsi.ceph import omap
from cephcsi.volumes.journal import SNAPSHOTS
from tests.ceph.fixtures import CephTestCluster
from tests.controlplane import snapshot_crds
from tests.controlplane.cluster import ControlPlane
from tests.integration.audit.seed import Seeder, admin_namespace, new_uuid, run_audit, write_config

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.kube, pytest.mark.slow]

DRIVER = "rbd.csi.ceph.com"


def volume_handle(cluster_id: str, pool_id: int, uuid: str) -> str:
    return f"0001-{len(cluster_id):04x}-{cluster_id}-{pool_id:016x}-{uuid}"


SNAPSHOT_SEEDER = functools.partial(Seeder, prefix="csi-snap-", kind=SNAPSHOTS)


@contextmanager
def fresh_namespace(cluster: CephTestCluster, tmp_path: Path, seeder: Callable[[Any], Seeder]
                    ) -> Iterator[tuple[str, str, Seeder]]:
    """(clusterID, config.json, seeder) of a fresh rados namespace with a clusterID of its own,
    so that PVs and VolumeSnapshotContents of other tests never match it."""
    namespace = f"audit-{uuidlib.uuid4().hex[:8]}"
    config = write_config(cluster, str(tmp_path / "config.json"), namespace, namespace)
    with admin_namespace(cluster, namespace) as io:
        yield namespace, config, seeder(io)


@pytest.fixture
def pvs(control_plane: ControlPlane) -> Iterator[Any]:
    """Creates PVs (cluster-scoped, so uniquely named) and deletes them afterwards."""
    created: list[str] = []
    with control_plane.api_client() as admin:
        core = kubernetes.client.CoreV1Api(admin)

        def make(handle: str, attributes: dict[str, str]) -> str:
            name = f"audit-{uuidlib.uuid4().hex[:10]}"
            core.create_persistent_volume({
                "metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Retain",
                         "csi": {"driver": DRIVER, "volumeHandle": handle, "volumeAttributes": attributes}},
            })
            created.append(name)
            return name

        yield make
        for name in created:
            core.delete_persistent_volume(name)


def test_pvs_and_images_are_compared_and_orphans_are_only_moved_when_safe(
        ceph_cluster: CephTestCluster, control_plane: ControlPlane, pvs: Any, tmp_path: Path) -> None:
    with fresh_namespace(ceph_cluster, tmp_path, Seeder) as (cluster_id, config, s):
        io = s.io
        pool_id = io.get_pool_id()
        attrs = {"clusterID": cluster_id, "pool": ceph_cluster.pool}
        bound, _ = s.volume("pvc-bound")
        pvs(volume_handle(cluster_id, pool_id, bound), {**attrs, "imageName": s.image_name(bound)})
        unclaimed, _ = s.volume("pvc-unclaimed")  # its PV was deleted by hand
        lost = new_uuid()  # journaled, PV bound, image deleted out of band
        s.key("pvc-lost", lost)
        s.record(lost, "pvc-lost")
        pv_lost = pvs(volume_handle(cluster_id, pool_id, lost), {**attrs, "imageName": s.image_name(lost)})
        pv_unknown = pvs(volume_handle(cluster_id, pool_id, new_uuid()), attrs)
        orphan, static, busy = (s.image_name(new_uuid()) for _ in range(3))
        for name in (orphan, static, busy):
            s.image(name)
        pvs(static, {**attrs, "imageName": static, "staticVolume": "true"})
        kube = ("--cluster-id", cluster_id, "--kubeconfig", str(control_plane.kubeconfig))

        rc, doc, _ = run_audit(ceph_cluster, config, *kube)
        assert rc == 1 and doc["kubernetes"]
        found = {(f["kind"], f["subject"]): f for f in doc["findings"]}
        assert set(found) == {
            ("image-without-pv", s.image_name(unclaimed)),
            ("dangling-record", "pvc-lost"), ("pv-image-gone", pv_lost), ("pv-image-gone", pv_unknown),
            ("orphan-image", orphan), ("orphan-image", static), ("orphan-image", busy),
        }
        assert found[("dangling-record", "pvc-lost")]["fix"] is None  # a PV names it
        assert found[("orphan-image", static)]["fix"] is None
        assert found[("orphan-image", orphan)]["fix"] == "move-orphan-to-trash"

        with rbd.Image(io, busy):  # a read-write open: a watcher, like a mapped volume
            rc, doc, _ = run_audit(ceph_cluster, config, *kube, "--repair", "--repair-orphan-images")
        outcomes = {(f["kind"], f["subject"]): f["repair"] for f in doc["findings"]}
        assert rc == 1
        assert outcomes[("orphan-image", orphan)]["outcome"] == "repaired"
        assert outcomes[("orphan-image", busy)]["outcome"] == "failed"
        assert "open read-write" in outcomes[("orphan-image", busy)]["action"]
        assert outcomes[("orphan-image", static)]["outcome"] == "skipped"
        assert {o["outcome"] for k, o in outcomes.items() if k[0] in ("pv-image-gone", "image-without-pv",
                                                                       "dangling-record")} == {"skipped"}

        # Nothing a PV names (or a journal record, or a client) was touched; the orphan is
        # in the trash, deferred, so it can be restored, and is no longer a finding.
        assert set(rbd.RBD().list(io)) == {s.image_name(bound), s.image_name(unclaimed), static, busy}
        trashed = [e for e in rbd.RBD().trash_list(io) if e["name"] == orphan]
        assert len(trashed) == 1
        assert trashed[0]["deferment_end_time"].timestamp() > time.time() + 6 * 86400
        rc, doc, _ = run_audit(ceph_cluster, config, *kube)
        assert ("orphan-image", orphan) not in {(f["kind"], f["subject"]) for f in doc["findings"]}
        rbd.RBD().trash_restore(io, trashed[0]["id"], orphan)
        rbd.Image(io, orphan, read_only=True).close()


CONTENTS = "volumesnapshotcontents"


@pytest.fixture
def contents(control_plane: ControlPlane) -> Iterator[Any]:
    """Installs the snapshot CRDs (they stay: tests.controlplane.snapshot_crds), then creates
    VolumeSnapshotContents as the snapshot-controller and the snapshotter would leave them and
    deletes them afterwards. No snapshot-controller runs: nothing else touches them."""
    created: list[str] = []
    snapshot_crds.ensure_installed(control_plane)
    with control_plane.api_client() as admin:
        custom = kubernetes.client.CustomObjectsApi(admin)

        def make(source: dict[str, str], handle: str = "", uid: str = "", driver: str = DRIVER) -> str:
            """`source` is {"snapshotHandle": ...} (pre-provisioned) or {"volumeHandle": ...}
            (dynamic, whose handle the snapshotter puts in status once it made the snapshot)."""
            name = f"audit-{uuidlib.uuid4().hex[:10]}"
            custom.create_cluster_custom_object(snapshot_crds.GROUP, snapshot_crds.VERSION, CONTENTS, {
                "apiVersion": f"{snapshot_crds.GROUP}/{snapshot_crds.VERSION}", "kind": "VolumeSnapshotContent",
                "metadata": {"name": name},
                "spec": {"driver": driver, "deletionPolicy": "Delete", "source": source,
                         "volumeSnapshotRef": {"namespace": "default", "name": name, **({"uid": uid} if uid else {})}},
            })
            created.append(name)
            if handle:
                custom.patch_cluster_custom_object_status(snapshot_crds.GROUP, snapshot_crds.VERSION, CONTENTS, name,
                                                          {"status": {"snapshotHandle": handle}})
            return name

        try:
            yield make
        finally:
            for name in created:
                custom.delete_cluster_custom_object(snapshot_crds.GROUP, snapshot_crds.VERSION, CONTENTS, name)


def test_without_the_snapshot_crds_the_audit_says_so_and_judges_as_before(
        ceph_cluster: CephTestCluster, control_plane: ControlPlane, tmp_path: Path) -> None:
    with control_plane.api_client() as admin:
        if CONTENTS in snapshot_crds.served_plurals(admin):
            pytest.skip("another test of this session installed the snapshot CRDs and left them")
    with fresh_namespace(ceph_cluster, tmp_path, SNAPSHOT_SEEDER) as (cluster_id, config, s):
        s.snapshot("snapshot-outside")  # no content could name it: not a finding without the CRDs
        kube = ("--cluster-id", cluster_id, "--kubeconfig", str(control_plane.kubeconfig))

        rc, doc, _ = run_audit(ceph_cluster, config, *kube)
        assert (rc, doc["findings"], doc["kubernetes"], doc["snapshot_contents"]) == (0, [], True, False)
        assert any("the snapshot CRDs are not installed" in note for note in doc["notes"]), doc["notes"]

        debris = new_uuid()  # a snapshot record whose image is gone: still judged, and repaired
        s.key("snapshot-debris", debris)
        s.record(debris, "snapshot-debris")
        rc, doc, _ = run_audit(ceph_cluster, config, *kube)
        no_kube_rc, no_kube_doc, _ = run_audit(ceph_cluster, config, "--cluster-id", cluster_id)
        assert rc == no_kube_rc == 1 and doc["findings"] == no_kube_doc["findings"]
        assert [(f["kind"], f["subject"], f["fix"]) for f in doc["findings"]] == [
            ("dangling-record", "snapshot-debris", "remove-record")]
        rc, doc, _ = run_audit(ceph_cluster, config, *kube, "--repair")
        assert rc == 0 and doc["findings"][0]["repair"]["outcome"] == "repaired"


def test_contents_and_snapshots_are_compared_and_named_snapshots_are_never_repaired(
        ceph_cluster: CephTestCluster, control_plane: ControlPlane, contents: Any, tmp_path: Path) -> None:
    with fresh_namespace(ceph_cluster, tmp_path, SNAPSHOT_SEEDER) as (cluster_id, config, s):
        io = s.io
        pool_id = io.get_pool_id()

        def handle(uuid: str, cluster: str = cluster_id) -> str:
            return volume_handle(cluster, pool_id, uuid)

        source = handle(new_uuid())  # the volume the dynamic contents were cut from
        dynamic, _ = s.snapshot("snapshot-dynamic")
        content_dynamic = contents({"volumeHandle": source}, handle=handle(dynamic), uid=new_uuid())
        imported, _ = s.snapshot("snapshot-imported")
        content_imported = contents({"snapshotHandle": handle(imported)})
        outside, _ = s.snapshot("snapshot-outside")  # made outside Kubernetes: no content names it
        contents({"snapshotHandle": handle(outside)}, driver="other.csi.example.com")
        contents({"snapshotHandle": handle(outside, cluster="another-cluster")})
        lost = new_uuid()  # journaled, named by a content, its image deleted out of band
        s.key("snapshot-lost", lost)
        s.record(lost, "snapshot-lost")
        content_lost = contents({"snapshotHandle": handle(lost)})
        content_unknown = contents({"snapshotHandle": handle(new_uuid())})
        orphan = new_uuid()  # an image whose record is gone, that a content still names
        s.image(s.image_name(orphan))
        content_orphan = contents({"snapshotHandle": handle(orphan)})
        pending_uid = new_uuid()  # CreateSnapshot killed after reserving; the CO retries it
        pending = f"snapshot-{pending_uid}"
        s.key(pending, new_uuid())
        contents({"volumeHandle": source}, uid=pending_uid)
        debris = new_uuid()  # the same shape as snapshot-lost, but no content names it
        s.key("snapshot-debris", debris)
        s.record(debris, "snapshot-debris")
        kube = ("--cluster-id", cluster_id, "--kubeconfig", str(control_plane.kubeconfig))

        rc, doc, _ = run_audit(ceph_cluster, config, *kube)
        assert rc == 1 and doc["snapshot_contents"] is True
        found = {(f["kind"], f["subject"]): f for f in doc["findings"]}
        assert set(found) == {
            ("snapshot-without-content", s.image_name(outside)),
            ("content-snapshot-gone", content_lost), ("dangling-record", "snapshot-lost"),
            ("content-snapshot-gone", content_unknown),
            ("content-snapshot-gone", content_orphan), ("orphan-image", s.image_name(orphan)),
            ("dangling-key", pending),
            ("dangling-record", "snapshot-debris"),
        }, sorted(found)
        assert {f["journal"] for f in found.values()} == {"snapshot"}
        named_by = {("dangling-record", "snapshot-lost"): content_lost, ("orphan-image", s.image_name(orphan)):
                    content_orphan, ("dangling-key", pending): None}
        for key, content in named_by.items():
            assert found[key]["fix"] is None and "VolumeSnapshotContent" in found[key]["why_not"], found[key]
            assert content is None or content in found[key]["why_not"]
        assert found[("dangling-record", "snapshot-debris")]["fix"] == "remove-record"
        # The listing names each snapshot image's contents.
        rc, doc, _ = run_audit(ceph_cluster, config, *kube, "--list-images")
        listed = {i["name"]: i["contents"] for i in doc["images"]}
        assert listed[s.image_name(dynamic)] == [content_dynamic]
        assert listed[s.image_name(imported)] == [content_imported]
        assert listed[s.image_name(outside)] == [] and listed[s.image_name(orphan)] == []

        rc, doc, _ = run_audit(ceph_cluster, config, *kube, "--repair", "--repair-orphan-images")
        outcomes = {(f["kind"], f["subject"]): f["repair"]["outcome"] for f in doc["findings"]}
        assert rc == 1 and outcomes.pop(("dangling-record", "snapshot-debris")) == "repaired"
        assert set(outcomes.values()) == {"skipped"}, doc["findings"]
        # What a content names is as it was: records, keys and images; the debris is gone.
        assert omap.read(io, f"csi.snap.{lost}") == {"csi.snapname": "snapshot-lost",
                                                    "csi.imagename": s.image_name(lost)}
        assert pending in {k[len("csi.snap."):] for k in omap.read(io, "csi.snaps.default") or {}}
        assert not omap.read(io, f"csi.snap.{debris}")
        assert set(rbd.RBD().list(io)) == {s.image_name(u) for u in (dynamic, imported, outside, orphan)}
        assert not list(rbd.RBD().trash_list(io))
