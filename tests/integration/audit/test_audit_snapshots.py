"""`cephcsi audit` over the snapshot journal on a real pool: debris left by driver processes
SIGKILLed at the snapshot and clone failpoints (and a few shapes seeded by hand), each found
with its journal named; `--repair` fixes what is the driver's, leaves what only a retry or a
person may decide, and after those the pool is exactly as before, with the healthy snapshot
and the volume restored from it untouched and readable."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.audit import scan_snaps
from cephcsi.ceph import omap as ceph_omap
from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import NORMAL, Seeder, admin_namespace, new_uuid, run_audit
from tests.integration.controller.helpers import MiB, create_request, image_of, until_ok
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import BLOCK, from_snapshot, from_volume, pattern, snapshot_request
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

DRAIN_SECONDS = 150.0


def omap(io: Any, obj: str) -> dict[str, str]:
    return ceph_omap.read(io, obj) or {}


def findings(doc: dict[str, Any]) -> set[tuple[str | None, str, str]]:
    return {(f["journal"], f["kind"], f["subject"]) for f in doc["findings"]}


def read_image(io: Any, name: str, length: int = BLOCK) -> bytes:
    with rbd.Image(io, name, read_only=True) as image:
        return bytes(image.read(0, length))


def write_image(io: Any, name: str, data: bytes) -> None:
    with rbd.Image(io, name) as image:
        image.write(data, 0)
        image.flush()


def test_audit_covers_the_snapshot_journal(ceph_cluster: CephTestCluster,
                                           drivers: tuple[str, str, Callable[..., DriverProcess]]) -> None:
    namespace, config, start = drivers

    def killed_at(point: str, call: Callable[[DriverProcess], object]) -> None:
        doomed_driver = start({"CEPHCSI_FAILPOINTS": point})
        with pytest.raises(grpc.RpcError):
            call(doomed_driver)
        assert doomed_driver.process is not None
        assert doomed_driver.process.wait(timeout=30) == -9, f"not killed at {point}"

    with admin_namespace(ceph_cluster, namespace) as io:
        healthy = start()
        c = healthy.controller
        source = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
        source_image = image_of(source.volume_id)
        cut = pattern("cut")
        write_image(io, source_image, cut)
        kept = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
        restored = c.CreateVolume(from_snapshot(ceph_cluster, kept.snapshot_id, size=16 * MiB), timeout=60).volume
        later = pattern("later")
        write_image(io, source_image, later)
        # Every snapshot or clone of a volume removes the temporary snapshots killed calls left
        # on it (under its lease), so each kill that leaves one gets a source of its own.
        other_sources = [c.CreateVolume(create_request(ceph_cluster), timeout=60).volume for _ in range(2)]
        baseline = read_pool(ceph_cluster, namespace)

        # --- debris of killed calls ---------------------------------------------------------
        doomed = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id, name="snapshot-doomed"),
                                  timeout=60).snapshot
        doomed_delete = csi_pb2.DeleteSnapshotRequest(snapshot_id=doomed.snapshot_id, secrets=ceph_cluster.secrets)
        killed_at("snapshot.delete.after-image", lambda d: d.controller.DeleteSnapshot(doomed_delete, timeout=60))
        deadline = time.monotonic() + 60  # until the mgr purged the doomed image: its record then dangles
        while rbd.RBD().trash_list(io) and time.monotonic() < deadline:
            time.sleep(0.5)
        requests = {point: snapshot_request(ceph_cluster, source.volume_id) for point in (
            "snapshot.after-reserve", "snapshot.after-record", "snapshot.after-clone")}
        requests["snapshot.after-source-snap"] = snapshot_request(ceph_cluster, other_sources[0].volume_id)
        for point, request in requests.items():
            killed_at(point, lambda d, r=request: d.controller.CreateSnapshot(r, timeout=60))  # type: ignore[misc]
        clone = from_volume(ceph_cluster, other_sources[1].volume_id)
        killed_at("clone.after-source-snap", lambda d: d.controller.CreateVolume(clone, timeout=60))

        # --- shapes seeded by hand ----------------------------------------------------------
        seeder = Seeder(io, prefix="csi-snap-")
        orphan_image = seeder.image_name(new_uuid())
        seeder.image(orphan_image)
        unqueued_id = seeder.trashed(seeder.image_name(new_uuid()), NORMAL)
        partial = seeder.image_name(new_uuid())
        seeder.partial_create(partial, with_id_object=True)
        orphan_record = new_uuid()
        seeder.set_omap(f"csi.snap.{orphan_record}", {"csi.snapname": "snapshot-lost",
                                                      "csi.imagename": seeder.image_name(orphan_record)})
        # The audit leaves alone what a lease holder may be doing: wait until the killed
        # drivers' leases lapsed (2 s after their death by the OSD's clock).
        records = [o.key for o in io.list_objects() if o.key.startswith(("csi.volume.", "csi.snap."))]
        deadline = time.monotonic() + 60
        while scan_snaps.read_leases(io, records) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not scan_snaps.read_leases(io, records)

        keys = omap(io, "csi.snaps.default")
        uuid_of = {point: keys[f"csi.snap.{r.name}"] for point, r in requests.items()}
        clone_uuid = omap(io, "csi.volumes.default")[f"csi.volume.{clone.name}"]
        names = {point: r.name for point, r in requests.items()}
        expected = {
            ("snapshot", "dangling-key", names["snapshot.after-reserve"]),
            ("snapshot", "dangling-record", names["snapshot.after-record"]),
            ("snapshot", "dangling-record", names["snapshot.after-source-snap"]),
            ("volume", "temp-snapshot",
             f"{image_of(other_sources[0].volume_id)}@cephcsi-tmp-{uuid_of['snapshot.after-source-snap']}"),
            ("snapshot", "unfinished-snapshot", names["snapshot.after-clone"]),
            ("volume", "temp-snapshot", f"{source_image}@cephcsi-tmp-{uuid_of['snapshot.after-clone']}"),
            ("volume", "dangling-record", clone.name),
            ("volume", "temp-snapshot", f"{image_of(other_sources[1].volume_id)}@cephcsi-tmp-{clone_uuid}"),
            ("snapshot", "dangling-record", "snapshot-doomed"),
            ("snapshot", "orphan-image", orphan_image),
            ("snapshot", "trash-unqueued", f"trash:{unqueued_id}"),
            ("snapshot", "partial-create", partial),
            ("snapshot", "orphan-record", f"csi.snap.{orphan_record}"),
        }

        rc, doc, _ = run_audit(ceph_cluster, config)
        assert rc == 1 and findings(doc) == expected, sorted(findings(doc) ^ expected)
        assert doc["snapshot_name_prefix"] == "csi-snap-"

        rc, doc, _ = run_audit(ceph_cluster, config, "--repair", timeout=300)
        outcomes = {(f["kind"], f["subject"]): f["repair"]["outcome"] for f in doc["findings"]}
        assert outcomes.pop(("orphan-image", orphan_image)) == "skipped"  # no --kubeconfig: a person decides
        assert outcomes.pop(("unfinished-snapshot", names["snapshot.after-clone"])) == "skipped"  # a retry may come
        assert set(outcomes.values()) == {"repaired"}, doc["findings"]
        assert rc == 1
        rbd.Image(io, orphan_image, read_only=True).close()  # left alone

        # What was left to others: the CO's retry finishes the unfinished snapshot (and its
        # VolumeSnapshot's deletion removes it), the operator removes the orphan.
        finished = until_ok(lambda: c.CreateSnapshot(requests["snapshot.after-clone"], timeout=60)).snapshot
        until_ok(lambda: c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(
            snapshot_id=finished.snapshot_id, secrets=ceph_cluster.secrets), timeout=60))
        rbd.RBD().remove(io, orphan_image)

        deadline = time.monotonic() + DRAIN_SECONDS
        while True:
            rc, doc, _ = run_audit(ceph_cluster, config)
            if rc == 0 or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert rc == 0, doc["findings"]
        assert wait_for_pool(ceph_cluster, baseline, timeout=DRAIN_SECONDS, namespace=namespace) == baseline

        # The healthy snapshot and the volume restored from it: untouched and readable.
        kept_image = f"csi-snap-{kept.snapshot_id[-36:]}"
        with rbd.Image(io, kept_image, read_only=True) as image:
            assert kept_image in {s["name"] for s in image.list_snaps()}
        assert read_image(io, image_of(restored.volume_id)) == cut
        assert read_image(io, source_image) == later
        listed = c.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id=kept.snapshot_id,
                                                              secrets=ceph_cluster.secrets), timeout=60)
        assert [e.snapshot.ready_to_use for e in listed.entries] == [True]

        # Clean up the way a CO would (retrying while a killed driver's watch on a source lasts).
        def delete_volume(volume_id: str) -> None:
            until_ok(lambda: c.DeleteVolume(csi_pb2.DeleteVolumeRequest(
                volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60),
                deadline=90, also=(grpc.StatusCode.FAILED_PRECONDITION,))

        for volume_id in (restored.volume_id, *(v.volume_id for v in other_sources)):
            delete_volume(volume_id)
        c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=kept.snapshot_id, secrets=ceph_cluster.secrets),
                         timeout=60)
        delete_volume(source.volume_id)
