"""`cephcsi audit --kubeconfig` against a real kube-apiserver: PVs whose image is gone, images
whose PV is gone, and the orphan-image repair, which must never touch an image a PV names or
a client uses, and must leave what it moves restorable in the trash."""
from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import rbd

from tests.ceph.fixtures import CephTestCluster
from tests.controlplane.cluster import ControlPlane
from tests.integration.audit.seed import Seeder, admin_namespace, new_uuid, run_audit, write_config

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.kube, pytest.mark.slow]

DRIVER = "rbd.csi.ceph.com"


def volume_handle(cluster_id: str, pool_id: int, uuid: str) -> str:
    return f"0001-{len(cluster_id):04x}-{cluster_id}-{pool_id:016x}-{uuid}"


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
    namespace = f"audit-{uuidlib.uuid4().hex[:8]}"
    cluster_id = namespace  # its own clusterID: PVs of other tests never match it
    config = write_config(ceph_cluster, str(tmp_path / "config.json"), namespace, cluster_id)
    with admin_namespace(ceph_cluster, namespace) as io:
        s = Seeder(io)
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
