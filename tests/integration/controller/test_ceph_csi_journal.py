"""Volumes journaled by ceph-csi itself, written with raw RADOS calls in ceph-csi's order and keys
(tests/ceph/ceph_csi_journal.py), not through cephcsi's own Journal. cephcsi must adopt such a
volume for a retried CreateVolume, grow it and delete it with everything ceph-csi wrote. Records
from ceph-csi releases before csi.imagename existed name their image csi-vol-<uuid> implicitly.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.ceph_csi_journal import journal_as_ceph_csi
from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import run_audit
from tests.integration.controller.helpers import MiB, create_request, journal_entries, mount_cap
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import from_snapshot, from_volume, snapshot_request
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def _size(cluster: CephTestCluster, image: str) -> int:
    return int(json.loads(cluster.admin("rbd", "info", "--format", "json", f"{cluster.pool}/{image}"))["size"])


@pytest.mark.parametrize("with_image_key", [True, False], ids=["current", "before-csi.imagename"])
def test_a_volume_journaled_by_ceph_csi_is_adopted_grown_and_deleted(
    driver: DriverProcess, ceph_cluster: CephTestCluster, with_image_key: bool
) -> None:
    baseline = read_pool(ceph_cluster)
    request = create_request(ceph_cluster, size=8 * MiB)
    volume = journal_as_ceph_csi(ceph_cluster, request.name, with_image_key=with_image_key)
    volume_id, image = volume.volume_id, volume.image

    # `cephcsi audit` sees a consistent volume (other tests' debris in this pool aside).
    _rc, doc, _ = run_audit(ceph_cluster, driver.config_file)
    volume_uuid = volume_id[-36:]
    assert not [f for f in doc["findings"] if volume_uuid in json.dumps(f)], doc["findings"]

    # The external-provisioner retries CreateVolume after the switch: the same volume comes back.
    adopted = driver.controller.CreateVolume(request, timeout=60).volume
    assert adopted.volume_id == volume_id and adopted.capacity_bytes == 8 * MiB
    assert adopted.volume_context["imageName"] == image

    grown = driver.controller.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
        volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=24 * MiB),
        secrets=ceph_cluster.secrets, volume_capability=mount_cap()), timeout=60)
    assert grown.capacity_bytes == 24 * MiB and _size(ceph_cluster, image) == 24 * MiB

    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets),
                                   timeout=60)
    assert image not in ceph_cluster.images()
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline


# ---- volumes ceph-csi journaled in one pool and created in another (topologyConstrainedPools) ----


def _admin_pool(cluster: CephTestCluster, pool: str) -> tuple[Any, Any]:
    import rados

    client = rados.Rados(rados_id="admin", conf={"mon_host": cluster.mon_host, "key": cluster.admin_key})
    client.connect(timeout=30)
    return client, client.open_ioctx(pool)


def _omap_set(io: Any, obj: str, values: dict[str, str]) -> None:
    import rados

    with rados.WriteOpCtx() as op:
        io.set_omap(op, tuple(values), tuple(v.encode() for v in values.values()))
        io.operate_write_op(op, obj)


def _journal_split_as_ceph_csi(cluster: CephTestCluster, name: str, record_in_journal_pool: bool) -> tuple[str, str]:
    """(volume id, image) of a volume ceph-csi's ReserveName/CreateVolume made with journal pool
    `cluster.pool` (the StorageClass `pool`) and image pool `cluster.pool2`, step by step as its
    code does (internal/journal/voljournal.go, internal/rbd/rbd_journal.go):

      1. image pool: exclusive create of csi.volume.<uuid> (the uuid's reservation, left empty)
      2. journal pool: csi.volumes.default key csi.volume.<name> = <image pool id, 16 hex>/<uuid>
      3. journal pool (`record_in_journal_pool`, what the code does) or image pool (what its
         comments describe): csi.volname, csi.imagename, csi.volume.owner, csi.journalpool =
         <journal pool id, 16 hex>
      4. image pool: the image; then csi.imageid into the record of step 3
    """
    volume_uuid = str(uuid.uuid4())
    image = f"csi-vol-{volume_uuid}"
    image_id_of_pool = _split_as_ceph_csi(
        cluster, volume_uuid, "csi.volume.", "csi.volumes.default", f"csi.volume.{name}",
        {"csi.volname": name, "csi.imagename": image, "csi.volume.owner": "team-a"}, record_in_journal_pool)
    return VolumeId(cluster.cluster_id, image_id_of_pool, volume_uuid).encode(), image


def _split_as_ceph_csi(cluster: CephTestCluster, entry_uuid: str, record_prefix: str, directory: str, name_key: str,
                       values: dict[str, str], record_in_journal_pool: bool, restore_point: bool = False) -> int:
    """ceph-csi's split journal entry for one image (see `_journal_split_as_ceph_csi`), for its
    volume or snapshot journal; the image is named by `values["csi.imagename"]`, and with
    `restore_point` carries a snapshot of its own name. Returns the image pool's id."""
    import rados
    import rbd

    record, image = f"{record_prefix}{entry_uuid}", values["csi.imagename"]
    journal_client, journal_io = _admin_pool(cluster, cluster.pool)
    image_client, image_io = _admin_pool(cluster, cluster.pool2)
    try:
        journal_id, image_pool_id = journal_io.get_pool_id(), image_io.get_pool_id()
        with rados.WriteOpCtx() as op:
            op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
            image_io.operate_write_op(op, record)
        _omap_set(journal_io, directory, {name_key: f"{image_pool_id:016x}/{entry_uuid}"})
        record_io = journal_io if record_in_journal_pool else image_io
        _omap_set(record_io, record, {**values, "csi.journalpool": f"{journal_id:016x}"})
        rbd.RBD().create(image_io, image, 8 * MiB, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        with rbd.Image(image_io, image) as handle:
            if restore_point:
                handle.create_snap(image)
            _omap_set(record_io, record, {"csi.imageid": handle.id()})
    finally:
        for io, client in ((journal_io, journal_client), (image_io, image_client)):
            io.close()
            client.shutdown()
    return int(image_pool_id)


def _journal_objects(cluster: CephTestCluster, pool: str, entry_uuid: str, name: str,
                     snapshot: bool = False) -> dict[str, object]:
    """What either pool still holds of the volume (or snapshot): its record object, name key,
    image, trash entry."""
    record_prefix, directory, image_prefix = \
        ("csi.snap.", "csi.snaps.default", "csi-snap-") if snapshot else ("csi.volume.", "csi.volumes.default", "csi-vol-")
    client, io = _admin_pool(cluster, pool)
    try:
        import rados

        objects = {o.key for o in io.list_objects()}
        with rados.ReadOpCtx() as op:
            items, _ = io.get_omap_vals_by_keys(op, (f"{record_prefix}{name}",))
            try:
                io.operate_read_op(op, directory)
                key = dict(items)
            except rados.ObjectNotFound:
                key = {}
    finally:
        io.close()
        client.shutdown()
    images = json.loads(cluster.admin("rbd", "ls", "-p", pool, "--format", "json") or "[]")
    trash = json.loads(cluster.admin("rbd", "trash", "ls", "-p", pool, "--format", "json") or "[]")
    return {
        "record": f"{record_prefix}{entry_uuid}" in objects,
        "name key": bool(key),
        "image": f"{image_prefix}{entry_uuid}" in images,
        "trash": any(entry["name"] == f"{image_prefix}{entry_uuid}" for entry in trash),
    }


def _gone(cluster: CephTestCluster, pool: str, entry_uuid: str, name: str, timeout: float = 120,
          snapshot: bool = False) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        left = _journal_objects(cluster, pool, entry_uuid, name, snapshot)
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


@pytest.mark.parametrize("record_in_journal_pool", [True, False], ids=["record-in-journal-pool", "record-in-image-pool"])
def test_a_ceph_csi_volume_journaled_in_another_pool_is_adopted_grown_audited_and_deleted(
    driver: DriverProcess, ceph_cluster: CephTestCluster, record_in_journal_pool: bool
) -> None:
    assert ceph_cluster.pool2, "the test cluster has no second pool (tests/ceph/cluster.sh)"
    request = create_request(ceph_cluster, size=8 * MiB)  # the StorageClass `pool` is the journal pool
    volume_id, image = _journal_split_as_ceph_csi(ceph_cluster, request.name, record_in_journal_pool)
    volume_uuid = volume_id[-36:]

    # Audit of either pool: neither the <pool id>/<uuid> key, the record, the empty object in
    # the image pool nor the image is reported (other tests' debris aside).
    for pool in (ceph_cluster.pool, ceph_cluster.pool2):
        _rc, doc, _ = run_audit(ceph_cluster, driver.config_file, "--pool", pool)
        assert not [f for f in doc["findings"] if volume_uuid in json.dumps(f)], (pool, doc["findings"])

    # A retried CreateVolume resolves the key into the image pool: the same volume, same id.
    adopted = driver.controller.CreateVolume(request, timeout=60).volume
    assert adopted.volume_id == volume_id and adopted.capacity_bytes == 8 * MiB
    assert adopted.volume_context["imageName"] == image
    assert adopted.volume_context["pool"] == ceph_cluster.pool2

    grown = driver.controller.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
        volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=24 * MiB),
        secrets=ceph_cluster.secrets, volume_capability=mount_cap()), timeout=60)
    info = json.loads(ceph_cluster.admin("rbd", "info", "--format", "json", f"{ceph_cluster.pool2}/{image}"))
    assert grown.capacity_bytes == 24 * MiB and int(info["size"]) == 24 * MiB

    # Still consistent after cephcsi touched it (the lock it took leaves nothing behind).
    for pool in (ceph_cluster.pool, ceph_cluster.pool2):
        _rc, doc, _ = run_audit(ceph_cluster, driver.config_file, "--pool", pool, "--repair")
        assert not [f for f in doc["findings"] if volume_uuid in json.dumps(f)], (pool, doc["findings"])
    assert _journal_objects(ceph_cluster, ceph_cluster.pool, volume_uuid, request.name)["name key"]

    # Snapshots and clones read the source's record wherever ceph-csi put it.
    c = driver.controller
    snapshot = c.CreateSnapshot(snapshot_request(ceph_cluster, volume_id), timeout=60).snapshot
    assert snapshot.ready_to_use and snapshot.source_volume_id == volume_id
    restored = c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id, size=24 * MiB), timeout=60).volume
    cloned = c.CreateVolume(from_volume(ceph_cluster, volume_id, size=24 * MiB), timeout=60).volume
    for made in (restored, cloned):
        c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=made.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot.snapshot_id, secrets=ceph_cluster.secrets),
                     timeout=60)

    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets),
                                   timeout=60)
    # Nothing left in either pool: name key, records, image, trash entry (once the mgr purged it).
    for pool in (ceph_cluster.pool, ceph_cluster.pool2):
        assert _gone(ceph_cluster, pool, volume_uuid, request.name) == \
            {"record": False, "name key": False, "image": False, "trash": False}, pool
    # A repeated delete is a success that changes nothing.
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets),
                                   timeout=60)
    assert not any(_journal_objects(ceph_cluster, ceph_cluster.pool2, volume_uuid, request.name).values())


def _snapshot_split_as_ceph_csi(cluster: CephTestCluster, source_image: str, record_in_journal_pool: bool
                                ) -> tuple[str, str, str]:
    """(snapshot id, request name, snapshot image) of a snapshot ceph-csi's CreateSnapshot made of a
    volume it journaled in `cluster.pool` with its image in `cluster.pool2`: the snapshot journal
    is split the same way as the volume's (its reserveSnap passes the source's journal pool and
    image pool to ReserveName), and the snapshot image, a copy of the source, carries the restore
    point snapshot named after itself."""
    snap_uuid = str(uuid.uuid4())
    name, image = f"snapshot-{uuid.uuid4()}", f"csi-snap-{snap_uuid}"
    image_pool_id = _split_as_ceph_csi(
        cluster, snap_uuid, "csi.snap.", "csi.snaps.default", f"csi.snap.{name}",
        {"csi.snapname": name, "csi.imagename": image, "csi.source": source_image, "csi.volume.owner": "team-a"},
        record_in_journal_pool, restore_point=True)
    return VolumeId(cluster.cluster_id, image_pool_id, snap_uuid).encode(), name, image


@pytest.mark.parametrize("record_in_journal_pool", [True, False], ids=["record-in-journal-pool", "record-in-image-pool"])
def test_a_ceph_csi_snapshot_journaled_in_another_pool_is_deleted_with_everything_it_wrote(
    driver: DriverProcess, ceph_cluster: CephTestCluster, record_in_journal_pool: bool
) -> None:
    """Restored from, then deleted. Before, a restore answered NOT_FOUND, and DeleteSnapshot took
    the empty object in the image pool for an orphan, removed it and answered OK: the snapshot
    image and the journal pool's name key and record stayed."""
    volume_name = f"pvc-{uuid.uuid4()}"
    volume_id, source = _journal_split_as_ceph_csi(ceph_cluster, volume_name, record_in_journal_pool)
    snapshot_id, name, image = _snapshot_split_as_ceph_csi(ceph_cluster, source, record_in_journal_pool)
    snap_uuid = snapshot_id[-36:]
    assert _journal_objects(ceph_cluster, ceph_cluster.pool2, snap_uuid, name, snapshot=True)["image"]
    # Audit of either pool, repairing: nothing of the snapshot is reported, nothing is removed.
    for pool in (ceph_cluster.pool, ceph_cluster.pool2):
        _rc, doc, _ = run_audit(ceph_cluster, driver.config_file, "--pool", pool, "--repair")
        assert not [f for f in doc["findings"] if snap_uuid in json.dumps(f)], (pool, doc["findings"])
    assert _journal_objects(ceph_cluster, ceph_cluster.pool2, snap_uuid, name, snapshot=True)["record"]
    c = driver.controller
    # Listed by id (the snapshotter's check of a pre-provisioned content), by source and in the
    # full listing, once, with the split volume as its source.
    by_id = csi_pb2.ListSnapshotsRequest(snapshot_id=snapshot_id, secrets=ceph_cluster.secrets)
    by_source = csi_pb2.ListSnapshotsRequest(source_volume_id=volume_id, secrets=ceph_cluster.secrets)
    everything = csi_pb2.ListSnapshotsRequest(secrets=ceph_cluster.secrets)
    for request in (by_id, by_source, everything):
        entries = c.ListSnapshots(request, timeout=60).entries
        (listed,) = [e.snapshot for e in entries if e.snapshot.snapshot_id == snapshot_id]
        assert (listed.source_volume_id, listed.size_bytes, listed.ready_to_use) == (volume_id, 8 * MiB, True)
    restored = c.CreateVolume(from_snapshot(ceph_cluster, snapshot_id, size=16 * MiB), timeout=60).volume
    assert restored.capacity_bytes == 16 * MiB
    assert restored.content_source.snapshot.snapshot_id == snapshot_id
    parent = json.loads(ceph_cluster.admin("rbd", "info", "--format", "json",
                                           f"{ceph_cluster.pool}/{restored.volume_context['imageName']}"))["parent"]
    assert (parent["pool"], parent["image"], parent["snapshot"]) == (ceph_cluster.pool2, image, image)
    c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=restored.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    delete = csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=ceph_cluster.secrets)
    for _ in range(2):  # a repeated delete is a success that changes nothing
        driver.controller.DeleteSnapshot(delete, timeout=60)
        for pool in (ceph_cluster.pool, ceph_cluster.pool2):
            assert _gone(ceph_cluster, pool, snap_uuid, name, snapshot=True) == \
                {"record": False, "name key": False, "image": False, "trash": False}, (pool, image)
        assert not c.ListSnapshots(by_id, timeout=60).entries
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets),
                                   timeout=60)
    for pool in (ceph_cluster.pool, ceph_cluster.pool2):
        assert _gone(ceph_cluster, pool, volume_id[-36:], volume_name) == \
            {"record": False, "name key": False, "image": False, "trash": False}, pool


@pytest.mark.parametrize("left", ["reservation-object", "nothing", "no-pool"])
def test_a_ceph_csi_name_key_into_another_pool_with_nothing_behind_it_is_released_by_the_audit(
    driver: DriverProcess, ceph_cluster: CephTestCluster, left: str
) -> None:
    """ceph-csi's undo of a topology-constrained create removes the image pool's object before the
    name key: killed between the two, it leaves a key no volume is behind (or one into a pool
    since deleted). The name cannot be provisioned again until the key goes; `--repair` releases
    it, but never while the image pool holds the uuid's object (a ceph-csi create may be in flight)."""
    name, entry = f"pvc-{uuid.uuid4()}", str(uuid.uuid4())
    obj = f"csi.volume.{entry}"
    journal_client, journal_io = _admin_pool(ceph_cluster, ceph_cluster.pool)
    image_client, image_io = _admin_pool(ceph_cluster, ceph_cluster.pool2)
    try:
        pool_id = 0x7FFE if left == "no-pool" else image_io.get_pool_id()
        _omap_set(journal_io, "csi.volumes.default", {f"csi.volume.{name}": f"{pool_id:016x}/{entry}"})
        c = driver.controller
        with pytest.raises(grpc.RpcError) as refused:
            c.CreateVolume(create_request(ceph_cluster, name=name), timeout=60)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cephcsi audit --repair" in str(refused.value.details())
        if left == "reservation-object":
            image_io.write_full(obj, b"")

        _rc, doc, _ = run_audit(ceph_cluster, driver.config_file, "--pool", ceph_cluster.pool, "--repair")
        (finding,) = [f for f in doc["findings"] if f["subject"] == name]
        if left == "reservation-object":
            assert (finding["fix"], finding["repair"]["outcome"]) == ("release-split-key", "skipped"), finding
            assert obj in finding["repair"]["action"]
            image_io.remove_object(obj)
            _rc, doc, _ = run_audit(ceph_cluster, driver.config_file, "--pool", ceph_cluster.pool, "--repair")
            (finding,) = [f for f in doc["findings"] if f["subject"] == name]
        assert (finding["fix"], finding["repair"]["outcome"]) == ("release-split-key", "repaired"), finding
        assert journal_entries(ceph_cluster, name)[0] is None
        assert not _journal_objects(ceph_cluster, ceph_cluster.pool, entry, name)["record"], "the audit's lock left nothing"

        volume = c.CreateVolume(create_request(ceph_cluster, name=name), timeout=60).volume  # the name is free again
        assert VolumeId.decode(volume.volume_id).pool_id == journal_io.get_pool_id()
        c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    finally:
        for io, client in ((journal_io, journal_client), (image_io, image_client)):
            io.close()
            client.shutdown()
