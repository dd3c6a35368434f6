"""Snapshots, restores and clones on real Ceph: the data comes back, sources can go first, the
flatten policy shortens chains in the background, and nothing is left behind."""
from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
import rados

from cephcsi._generated import csi_pb2
from cephcsi.ceph import omap
from cephcsi.volumes.snapshots import CREATED, SOURCE_VOLUME_ID
from cephcsi.volumes.sources import FINISHED_SIZE
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request, image_of
from tests.integration.controller.pool_state import admin_ioctx, read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import (
    BLOCK,
    delete_all,
    depth,
    from_snapshot,
    from_volume,
    pattern,
    read,
    snapshot_request,
    wait_for,
    write,
)
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def test_snapshot_restore_and_clone_read_back_the_data(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    before, after = pattern("before"), pattern("after")
    write(ceph_cluster, source.volume_id, before, BLOCK)
    snapshot = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    assert snapshot.ready_to_use and snapshot.size_bytes == 16 * MiB
    assert snapshot.source_volume_id == source.volume_id and snapshot.creation_time.seconds > 0
    write(ceph_cluster, source.volume_id, after, BLOCK)

    restored = c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id, size=32 * MiB), timeout=60).volume
    assert restored.capacity_bytes == 32 * MiB, "a larger restore grows the clone"
    assert restored.content_source.snapshot.snapshot_id == snapshot.snapshot_id
    assert read(ceph_cluster, restored.volume_id, BLOCK, BLOCK) == before
    clone = c.CreateVolume(from_volume(ceph_cluster, source.volume_id, size=0), timeout=60).volume
    assert clone.capacity_bytes == 16 * MiB, "no size asked: the source's size"
    assert read(ceph_cluster, clone.volume_id, BLOCK, BLOCK) == after

    # Sources first: the dependents keep reading.
    c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=source.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    assert read(ceph_cluster, clone.volume_id, BLOCK, BLOCK) == after
    again = c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id), timeout=60).volume
    assert read(ceph_cluster, again.volume_id, BLOCK, BLOCK) == before, "a snapshot outlives its source"
    c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot.snapshot_id, secrets=ceph_cluster.secrets), timeout=60)
    assert read(ceph_cluster, restored.volume_id, BLOCK, BLOCK) == before
    delete_all(driver, ceph_cluster, [], [restored.volume_id, clone.volume_id, again.volume_id])
    assert wait_for_pool(ceph_cluster, baseline, timeout=90) == baseline, "parents in the trash go with their last child"


def test_a_restore_takes_a_finished_snapshot_from_its_record(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    before = pattern("record")
    write(ceph_cluster, source.volume_id, before, BLOCK)
    snapshot = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    record_object = f"csi.snap.{VolumeId.decode(snapshot.snapshot_id).object_uuid}"
    with admin_ioctx(ceph_cluster) as io:
        record = omap.read(io, record_object) or {}
        assert record.get(FINISHED_SIZE) == str(16 * MiB) and record.get("csi.imageid"), record
    restored = c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id), timeout=60).volume
    assert restored.capacity_bytes == 16 * MiB
    assert read(ceph_cluster, restored.volume_id, BLOCK, BLOCK) == before
    # A record without the size (ceph-csi's, or one cephcsi wrote before the key existed): the
    # restore opens the snapshot image for its restore point, size and id instead.
    with admin_ioctx(ceph_cluster) as io, rados.WriteOpCtx() as op:
        io.remove_omap_keys(op, (FINISHED_SIZE,))
        io.operate_write_op(op, record_object)
    again = c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id), timeout=60).volume
    assert again.capacity_bytes == 16 * MiB
    assert read(ceph_cluster, again.volume_id, BLOCK, BLOCK) == before
    delete_all(driver, ceph_cluster, [snapshot.snapshot_id], [restored.volume_id, again.volume_id, source.volume_id])
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline


def test_errors_per_spec(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    snapshot = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    cases: list[tuple[Callable[[], object], grpc.StatusCode]] = [
        (lambda: c.CreateVolume(_limited(from_snapshot(ceph_cluster, snapshot.snapshot_id), 8 * MiB), timeout=60),
         grpc.StatusCode.OUT_OF_RANGE),
        (lambda: c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id[:-4] + "0000"), timeout=60),
         grpc.StatusCode.NOT_FOUND),
        (lambda: c.CreateVolume(from_volume(ceph_cluster, "no-such-volume"), timeout=60), grpc.StatusCode.NOT_FOUND),
        (lambda: c.CreateSnapshot(snapshot_request(ceph_cluster, "no-such-volume"), timeout=60), grpc.StatusCode.NOT_FOUND),
        (lambda: c.CreateSnapshot(csi_pb2.CreateSnapshotRequest(name="x", source_volume_id=source.volume_id,
                                                                parameters={"bogus": "1"}, secrets=ceph_cluster.secrets),
                                  timeout=60), grpc.StatusCode.INVALID_ARGUMENT),
        (lambda: c.ListSnapshots(csi_pb2.ListSnapshotsRequest(starting_token="garbage", secrets=ceph_cluster.secrets),
                                 timeout=60), grpc.StatusCode.ABORTED),
    ]
    for call, code in cases:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == code, caught.value.details()
    name = f"same-{source.volume_id[-8:]}"
    request = from_snapshot(ceph_cluster, snapshot.snapshot_id, name=name)
    first = c.CreateVolume(request, timeout=60).volume
    assert c.CreateVolume(request, timeout=60).volume.volume_id == first.volume_id
    with pytest.raises(grpc.RpcError) as caught:
        c.CreateVolume(from_volume(ceph_cluster, source.volume_id, name=name), timeout=60)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    delete_all(driver, ceph_cluster, [snapshot.snapshot_id], [first.volume_id, source.volume_id])


def _limited(request: csi_pb2.CreateVolumeRequest, limit: int) -> csi_pb2.CreateVolumeRequest:
    """The request with capacity_range [limit/2, limit] (smaller than its 16 MiB source)."""
    request.capacity_range.CopyFrom(csi_pb2.CapacityRange(required_bytes=limit // 2, limit_bytes=limit))
    return request


def test_list_snapshots_pages_are_stable(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster), timeout=60).volume
    made = [c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot.snapshot_id
            for _ in range(5)]
    by_source = csi_pb2.ListSnapshotsRequest(source_volume_id=source.volume_id, max_entries=2, secrets=ceph_cluster.secrets)
    first = c.ListSnapshots(by_source, timeout=60)
    assert len(first.entries) == 2 and first.next_token
    # A snapshot deleted between pages shifts nothing: the token is the last id seen.
    c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=first.entries[0].snapshot.snapshot_id,
                                                   secrets=ceph_cluster.secrets), timeout=60)
    rest = c.ListSnapshots(csi_pb2.ListSnapshotsRequest(source_volume_id=source.volume_id, starting_token=first.next_token,
                                                        secrets=ceph_cluster.secrets), timeout=60)
    seen = [e.snapshot.snapshot_id for e in first.entries] + [e.snapshot.snapshot_id for e in rest.entries]
    assert sorted(seen) == sorted(made) and not rest.next_token
    gone = first.entries[0].snapshot.snapshot_id
    assert not c.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id=gone, secrets=ceph_cluster.secrets),
                               timeout=60).entries, "a deleted snapshot is not listed"
    kept = rest.entries[0].snapshot.snapshot_id
    one = c.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id=kept, secrets=ceph_cluster.secrets), timeout=60)
    assert [e.snapshot.snapshot_id for e in one.entries] == [kept]
    assert one.entries[0].snapshot.source_volume_id == source.volume_id
    delete_all(driver, ceph_cluster, [m for m in made if m != gone], [source.volume_id])


def test_a_snapshot_ceph_csi_made_is_listed_with_its_source(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    """ceph-csi's snapshot record names the source's image (csi.source), not its volume id, and
    keeps no creation time. The external-snapshotter asks ListSnapshots for the state of a
    pre-provisioned VolumeSnapshotContent (a backup tool's restore makes such), so a snapshot
    ceph-csi made must be listed like one of ours: by id, by source, in the full listing."""
    baseline = read_pool(ceph_cluster)
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    made = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    with admin_ioctx(ceph_cluster) as io, rados.WriteOpCtx() as op:
        # What cephcsi adds to ceph-csi's record, taken away: the record is then ceph-csi's.
        io.remove_omap_keys(op, (SOURCE_VOLUME_ID, CREATED, FINISHED_SIZE))
        io.operate_write_op(op, f"csi.snap.{VolumeId.decode(made.snapshot_id).object_uuid}")
    secrets = ceph_cluster.secrets
    listings = [c.ListSnapshots(request, timeout=60).entries for request in (
        csi_pb2.ListSnapshotsRequest(snapshot_id=made.snapshot_id, secrets=secrets),
        csi_pb2.ListSnapshotsRequest(source_volume_id=source.volume_id, secrets=secrets),
        csi_pb2.ListSnapshotsRequest(secrets=secrets),
    )]
    for entries in listings:
        (listed,) = [e.snapshot for e in entries if e.snapshot.snapshot_id == made.snapshot_id]
        assert (listed.source_volume_id, listed.size_bytes, listed.ready_to_use) == (source.volume_id, 16 * MiB, True)
        # The restore point's time: stable from call to call, a moment after the cut.
        assert listed.creation_time == listings[0][0].snapshot.creation_time
        assert 0 <= listed.creation_time.ToSeconds() - made.creation_time.ToSeconds() < 60
    delete_all(driver, ceph_cluster, [made.snapshot_id], [source.volume_id])
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline


def test_deep_chains_are_flattened_in_the_background(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    """snapshot → restore → snapshot → … with soft limit 1 and hard limit 2: every request
    returns at once; deep images are flattened by the mgr; a snapshot over the hard limit is
    not ready until its flatten finished, and then is."""
    baseline = read_pool(ceph_cluster)
    driver = fresh_driver(args=("--rbdsoftmaxclonedepth=1", "--rbdhardmaxclonedepth=2"))
    c = driver.controller
    volume = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    data = pattern("gen0")
    write(ceph_cluster, volume.volume_id, data)
    volumes, snapshots = [volume.volume_id], []
    for generation in range(4):
        snapshot = c.CreateSnapshot(snapshot_request(ceph_cluster, volumes[-1]), timeout=60).snapshot
        snapshots.append(snapshot.snapshot_id)
        restored = c.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id, size=16 * MiB), timeout=60).volume
        volumes.append(restored.volume_id)
        assert read(ceph_cluster, restored.volume_id, BLOCK) == data, f"generation {generation}"
    names = [image_of(v) for v in volumes] + [image_of(s, "csi-snap-") for s in snapshots]
    assert wait_for(lambda: all(depth(ceph_cluster, n) <= 2 for n in names), timeout=120), \
        {n: depth(ceph_cluster, n) for n in names}
    for snapshot_id in snapshots:
        listed = c.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id=snapshot_id, secrets=ceph_cluster.secrets), timeout=60)
        assert listed.entries[0].snapshot.ready_to_use
    assert read(ceph_cluster, volumes[-1], BLOCK) == data
    delete_all(driver, ceph_cluster, snapshots, volumes)
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline
