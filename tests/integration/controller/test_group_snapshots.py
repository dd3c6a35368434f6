"""Volume group snapshots (CSI GroupController) on real Ceph: one crash-consistent instant across
every member while a writer keeps writing, each member an ordinary snapshot (restore, list,
delete), idempotent by name, clear refusals, and crash safety (named failpoints and random
SIGKILLs) with the pool left exactly as it was once everything is deleted.
"""
from __future__ import annotations

import hashlib
import random
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.ceph import omap
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request, image_of, until_ok
from tests.integration.controller.pool_state import admin_ioctx, read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import from_snapshot
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

SIZE = 8 * MiB
SLOT = 4096
SLOTS = 256
"""The writer cycles over this many 4 KiB slots (1 MiB), so its state is small to rebuild."""


def group_stub(driver: DriverProcess) -> csi_pb2_grpc.GroupControllerStub:
    return csi_pb2_grpc.GroupControllerStub(driver.channel)


def group_request(cluster: CephTestCluster, volume_ids: list[str], name: str | None = None
                  ) -> csi_pb2.CreateVolumeGroupSnapshotRequest:
    return csi_pb2.CreateVolumeGroupSnapshotRequest(name=name or f"groupsnapshot-{uuid.uuid4()}",
                                                    source_volume_ids=volume_ids, secrets=cluster.secrets)


def delete_request(cluster: CephTestCluster, group: csi_pb2.VolumeGroupSnapshot) -> csi_pb2.DeleteVolumeGroupSnapshotRequest:
    return csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=group.group_snapshot_id,
                                                    snapshot_ids=[s.snapshot_id for s in group.snapshots],
                                                    secrets=cluster.secrets)


def block(volume: int, iteration: int) -> bytes:
    """What the writer's `iteration` writes to member `volume`: the iteration number first."""
    seed = hashlib.sha256(f"{volume}/{iteration}".encode()).digest()
    return (struct.pack(">Q", iteration) + seed * (SLOT // len(seed)))[:SLOT]


def expected_image(volume: int, iterations: int) -> bytes:
    """The member's content once the writer completed `iterations` writes to it."""
    data = bytearray(SIZE)
    for iteration in range(max(1, iterations - SLOTS + 1), iterations + 1):
        slot = iteration % SLOTS
        data[slot * SLOT:(slot + 1) * SLOT] = block(volume, iteration)
    return bytes(data)


def last_iteration(data: bytes) -> int:
    return max(int(struct.unpack(">Q", data[s * SLOT:s * SLOT + 8])[0]) for s in range(SLOTS))


class Writer:
    """Writes iteration i to member 0, then 1, then 2, ... for i = 1, 2, ... until stopped: at
    any instant the members have completed k, k or k-1 ... writes, never a later one in a
    later member."""

    def __init__(self, cluster: CephTestCluster, volume_ids: list[str]) -> None:
        self.cluster = cluster
        self.names = [image_of(v) for v in volume_ids]
        self.stop = threading.Event()
        self.iterations = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with admin_ioctx(self.cluster) as io:
            opened = [rbd.Image(io, name) for name in self.names]
            try:
                iteration = 0
                while not self.stop.is_set():
                    iteration += 1
                    for index, image in enumerate(opened):
                        image.write(block(index, iteration), (iteration % SLOTS) * SLOT)
                    self.iterations = iteration
            finally:
                for image in opened:
                    image.close()

    def __enter__(self) -> Writer:
        self.thread.start()
        while self.iterations < 20:
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(30)


def read_image(cluster: CephTestCluster, volume_id: str) -> bytes:
    with admin_ioctx(cluster) as io, rbd.Image(io, image_of(volume_id), read_only=True) as image:
        return bytes(image.read(0, SIZE))


def groups_left(cluster: CephTestCluster) -> tuple[list[str], dict[str, str]]:
    """(RBD groups, group journal directory keys) in the pool."""
    with admin_ioctx(cluster) as io:
        found: list[str] = list(rbd.RBD().group_list(io))
        keys: dict[str, str] = {}
        for obj in io.list_objects():
            if obj.key.startswith("csi.groups."):
                keys.update(omap.read(io, obj.key) or {})
    return found, keys


@pytest.fixture
def volumes(driver: DriverProcess, ceph_cluster: CephTestCluster) -> Iterator[Callable[[int], list[str]]]:
    made: list[str] = []

    def make(count: int) -> list[str]:
        new = [driver.controller.CreateVolume(create_request(ceph_cluster, size=SIZE), timeout=60).volume.volume_id
               for _ in range(count)]
        made.extend(new)
        return new

    yield make
    for volume_id in made:
        until_ok(lambda: driver.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60))


def test_capabilities(driver: DriverProcess) -> None:
    caps = group_stub(driver).GroupControllerGetCapabilities(csi_pb2.GroupControllerGetCapabilitiesRequest())
    assert [c.rpc.type for c in caps.capabilities] == [
        csi_pb2.GroupControllerServiceCapability.RPC.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT]


def test_one_instant_across_members_under_writes_restore_and_delete(
        driver: DriverProcess, ceph_cluster: CephTestCluster, volumes: Callable[[int], list[str]]) -> None:
    baseline = read_pool(ceph_cluster)
    sources = volumes(3)
    stub = group_stub(driver)
    request = group_request(ceph_cluster, sources)
    with Writer(ceph_cluster, sources) as writer:
        group = stub.CreateVolumeGroupSnapshot(request, timeout=120).group_snapshot
        during = writer.iterations
    assert group.ready_to_use and len(group.snapshots) == 3
    assert sorted(s.source_volume_id for s in group.snapshots) == sorted(sources)
    assert all(s.group_snapshot_id == group.group_snapshot_id and s.ready_to_use for s in group.snapshots)
    by_source = {s.source_volume_id: s for s in group.snapshots}

    # Idempotent: the same name and volumes answer the same group, whatever the order.
    again = stub.CreateVolumeGroupSnapshot(group_request(ceph_cluster, list(reversed(sources)), request.name),
                                           timeout=60).group_snapshot
    assert again.group_snapshot_id == group.group_snapshot_id
    assert sorted(s.snapshot_id for s in again.snapshots) == sorted(s.snapshot_id for s in group.snapshots)
    got = stub.GetVolumeGroupSnapshot(csi_pb2.GetVolumeGroupSnapshotRequest(
        group_snapshot_id=group.group_snapshot_id, secrets=ceph_cluster.secrets), timeout=60).group_snapshot
    assert sorted(s.snapshot_id for s in got.snapshots) == sorted(s.snapshot_id for s in group.snapshots)

    # Members are ordinary snapshots: listed, and restorable into new volumes.
    for snapshot in group.snapshots:
        listed = driver.controller.ListSnapshots(csi_pb2.ListSnapshotsRequest(
            snapshot_id=snapshot.snapshot_id, secrets=ceph_cluster.secrets), timeout=60).entries
        assert [e.snapshot.source_volume_id for e in listed] == [snapshot.source_volume_id]
    restored = {source: driver.controller.CreateVolume(from_snapshot(ceph_cluster, by_source[source].snapshot_id, SIZE),
                                                       timeout=60).volume.volume_id for source in sources}
    try:
        counts = []
        for index, source in enumerate(sources):
            data = read_image(ceph_cluster, restored[source])
            count = last_iteration(data)
            # The restore holds exactly what the member held after `count` writes: the checksum
            # of the state at the snapshot instant.
            assert hashlib.sha256(data).hexdigest() == hashlib.sha256(expected_image(index, count)).hexdigest()
            counts.append(count)
        # One instant: member i+1 is never ahead of member i, and at most one write behind.
        assert counts[0] >= counts[1] >= counts[2] >= counts[0] - 1, counts
        assert 20 <= counts[0] <= during + 1

        # Name reused with other volumes; unknown volumes; no volumes.
        with pytest.raises(grpc.RpcError) as error:
            stub.CreateVolumeGroupSnapshot(group_request(ceph_cluster, sources[:2], request.name), timeout=60)
        assert error.value.code() == grpc.StatusCode.ALREADY_EXISTS
        unknown = sources[0][:-36] + str(uuid.uuid4())
        with pytest.raises(grpc.RpcError) as error:
            stub.CreateVolumeGroupSnapshot(group_request(ceph_cluster, [sources[0], unknown]), timeout=60)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as error:
            stub.CreateVolumeGroupSnapshot(group_request(ceph_cluster, []), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        other_pool = sources[1][:-53] + f"{0xfff:016x}" + sources[1][-37:]
        with pytest.raises(grpc.RpcError) as error:
            stub.CreateVolumeGroupSnapshot(group_request(ceph_cluster, [sources[0], other_pool]), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "different pools" in (error.value.details() or "")
        with pytest.raises(grpc.RpcError) as error:
            stub.DeleteVolumeGroupSnapshot(csi_pb2.DeleteVolumeGroupSnapshotRequest(
                group_snapshot_id=group.group_snapshot_id, snapshot_ids=[group.snapshots[0].snapshot_id],
                secrets=ceph_cluster.secrets), timeout=60)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        stub.DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=120)
        stub.DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=60)  # already gone: OK
        with pytest.raises(grpc.RpcError) as error:
            stub.GetVolumeGroupSnapshot(csi_pb2.GetVolumeGroupSnapshotRequest(
                group_snapshot_id=group.group_snapshot_id, secrets=ceph_cluster.secrets), timeout=60)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        for snapshot in group.snapshots:
            assert not driver.controller.ListSnapshots(csi_pb2.ListSnapshotsRequest(
                snapshot_id=snapshot.snapshot_id, secrets=ceph_cluster.secrets), timeout=60).entries
        # Restores outlive the group snapshot.
        assert last_iteration(read_image(ceph_cluster, restored[sources[0]])) == counts[0]
    finally:
        for volume_id in restored.values():
            driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets),
                                           timeout=60)
    assert groups_left(ceph_cluster) == ([], {})
    for source in sources:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=source, secrets=ceph_cluster.secrets),
                                       timeout=60)
    assert wait_for_pool(ceph_cluster, baseline) == baseline


def test_layout_is_ceph_csis_and_a_group_ceph_csi_journaled_is_read_and_deleted(
        driver: DriverProcess, ceph_cluster: CephTestCluster, volumes: Callable[[int], list[str]]) -> None:
    baseline = read_pool(ceph_cluster)
    sources = volumes(2)
    stub = group_stub(driver)
    request = group_request(ceph_cluster, sources)
    group = stub.CreateVolumeGroupSnapshot(request, timeout=60).group_snapshot
    group_uuid = group.group_snapshot_id[-36:]
    # ceph-csi's group journal: name key → uuid; record: its three fields + snapshot id → image.
    assert ceph_cluster.omap("csi.groups.default") == {f"csi.volume.group.{request.name}": group_uuid}
    record = ceph_cluster.omap(f"csi.volume.group.{group_uuid}")
    assert record.pop("csi.volname") == request.name
    assert record.pop("csi.groupname") == f"csi-vol-group-{group_uuid}"
    assert record.pop("csi.creationtime").endswith("Z")
    assert record == {s.snapshot_id: f"csi-snap-{s.snapshot_id[-36:]}" for s in group.snapshots}
    stub.DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=60)

    # A group ceph-csi journaled (its own time format, a zone offset, nanoseconds) over two
    # snapshots: Get reads it, Delete removes the snapshots, the record and the name.
    snapshots = [driver.controller.CreateSnapshot(csi_pb2.CreateSnapshotRequest(
        name=f"snapshot-{uuid.uuid4()}", source_volume_id=v, secrets=ceph_cluster.secrets), timeout=60).snapshot
        for v in sources]
    theirs = str(uuid.uuid4())
    with admin_ioctx(ceph_cluster) as io:
        omap.update(io, "csi.groups.default", {"csi.volume.group.their-group": theirs})
        omap.create_exclusive(io, f"csi.volume.group.{theirs}", {
            "csi.volname": "their-group", "csi.groupname": f"csi-vol-group-{theirs}",
            "csi.creationtime": "2024-11-20T11:11:12.123456789+01:00",
            **{s.snapshot_id: f"csi-snap-{s.snapshot_id[-36:]}" for s in snapshots}})
    their_id = group.group_snapshot_id[:-36] + theirs
    got = stub.GetVolumeGroupSnapshot(csi_pb2.GetVolumeGroupSnapshotRequest(
        group_snapshot_id=their_id, secrets=ceph_cluster.secrets), timeout=60).group_snapshot
    assert sorted(s.snapshot_id for s in got.snapshots) == sorted(s.snapshot_id for s in snapshots)
    assert got.ready_to_use and all(s.group_snapshot_id == their_id for s in got.snapshots)
    stub.DeleteVolumeGroupSnapshot(csi_pb2.DeleteVolumeGroupSnapshotRequest(
        group_snapshot_id=their_id, secrets=ceph_cluster.secrets), timeout=60)
    for snapshot in snapshots:
        assert not driver.controller.ListSnapshots(csi_pb2.ListSnapshotsRequest(
            snapshot_id=snapshot.snapshot_id, secrets=ceph_cluster.secrets), timeout=60).entries
    assert groups_left(ceph_cluster) == ([], {}), "\n".join(l for l in driver.log().splitlines()[-400:] if "roup" in l)
    for source in sources:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=source, secrets=ceph_cluster.secrets),
                                       timeout=60)
    assert wait_for_pool(ceph_cluster, baseline) == baseline


CREATE_POINTS = ("group.after-record", "group.after-members", "group.after-rbd-group", "group.after-group-snap",
                 "group.after-copy", "group.after-member", "group.before-cleanup")
DELETE_POINTS = ("group.delete.after-rbd-group", "group.delete.after-member")
"""Every step with a half-done state of its own (group.after-reserve leaves only a name key,
which test_random_sigkills reaches)."""


def test_kill_at_every_step_then_retry_completes(
        fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    driver = fresh_driver()
    sources = [driver.controller.CreateVolume(create_request(ceph_cluster, size=SIZE), timeout=60).volume.volume_id
               for _ in range(2)]
    for index, volume_id in enumerate(sources):
        with admin_ioctx(ceph_cluster) as io, rbd.Image(io, image_of(volume_id)) as image:
            image.write(block(index, 1), SLOT)
    for point in (*CREATE_POINTS, *DELETE_POINTS):
        request = group_request(ceph_cluster, sources)
        doomed = fresh_driver(env={"CEPHCSI_FAILPOINTS": point})
        if point in CREATE_POINTS:
            with pytest.raises(grpc.RpcError) as error:
                group_stub(doomed).CreateVolumeGroupSnapshot(request, timeout=60)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE, point
            group = until_ok(lambda: group_stub(driver).CreateVolumeGroupSnapshot(request, timeout=60)).group_snapshot
            assert group.ready_to_use and len(group.snapshots) == 2, point
            assert groups_left(ceph_cluster)[0] == [], point
            if point in ("group.after-copy", "group.after-member"):  # copies resumed from the same instant
                for snapshot in group.snapshots:
                    restored = driver.controller.CreateVolume(from_snapshot(ceph_cluster, snapshot.snapshot_id, SIZE),
                                                              timeout=60).volume.volume_id
                    member = sources.index(snapshot.source_volume_id)
                    assert read_image(ceph_cluster, restored)[SLOT:2 * SLOT] == block(member, 1), point
                    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(
                        volume_id=restored, secrets=ceph_cluster.secrets), timeout=60)
            until_ok(lambda: group_stub(driver).DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=60))
        else:
            group = group_stub(driver).CreateVolumeGroupSnapshot(request, timeout=60).group_snapshot
            with pytest.raises(grpc.RpcError) as error:
                group_stub(doomed).DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=60)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE, point
            until_ok(lambda: group_stub(driver).DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=60))
        doomed.cleanup()
        assert groups_left(ceph_cluster) == ([], {}), point
    for volume_id in sources:
        until_ok(lambda: driver.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60))
    assert wait_for_pool(ceph_cluster, baseline) == baseline


def test_random_sigkills_during_group_creates_and_deletes(
        fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    driver = fresh_driver()
    sources = [driver.controller.CreateVolume(create_request(ceph_cluster, size=SIZE), timeout=60).volume.volume_id
               for _ in range(6)]
    started = time.monotonic()
    stop = threading.Event()
    kills: list[float] = []

    def killer() -> None:
        while len(kills) < 4 and not stop.wait(random.uniform(0.1, 0.8)):
            assert driver.process is not None
            driver.process.kill()
            driver.process.wait()
            kills.append(time.monotonic())
            driver.start()

    def retried(call: Callable[[csi_pb2_grpc.GroupControllerStub], object]) -> object:
        with grpc.insecure_channel(driver.endpoint, options=[("grpc.initial_reconnect_backoff_ms", 50),
                                                             ("grpc.max_reconnect_backoff_ms", 500)]) as channel:
            # FAILED_PRECONDITION: an image a killed driver had open keeps its watch for 30 s.
            return until_ok(lambda: call(csi_pb2_grpc.GroupControllerStub(channel)), deadline=120,
                            also=(grpc.StatusCode.FAILED_PRECONDITION,))

    results: list[csi_pb2.CreateVolumeGroupSnapshotResponse] = []

    def create(request: csi_pb2.CreateVolumeGroupSnapshotRequest) -> None:
        response = retried(lambda s: s.CreateVolumeGroupSnapshot(request, timeout=30))
        assert isinstance(response, csi_pb2.CreateVolumeGroupSnapshotResponse)
        results.append(response)

    def delete(group: csi_pb2.VolumeGroupSnapshot) -> None:
        retried(lambda s: s.DeleteVolumeGroupSnapshot(delete_request(ceph_cluster, group), timeout=30))

    def together(target: Callable[..., None], items: list[Any]) -> None:
        workers = [threading.Thread(target=target, args=(item,)) for item in items]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        # Rounds of concurrent creates then deletes until the killer has struck a few times.
        for _ in range(5):
            results.clear()
            together(create, [group_request(ceph_cluster, sources[i:i + 2]) for i in range(0, 6, 2)])
            assert len(results) == 3
            assert all(r.group_snapshot.ready_to_use and len(r.group_snapshot.snapshots) == 2 for r in results)
            together(delete, [r.group_snapshot for r in results])
            if len(kills) >= 3:
                break
    finally:
        stop.set()
        thread.join()
    print(f"{len(kills)} kills at {[round(k - started, 2) for k in kills]} s")
    assert kills
    assert groups_left(ceph_cluster) == ([], {})
    for volume_id in sources:
        # A source a killed driver had open (adding it to the RBD group, taking the group
        # snapshot) keeps that client's watch for up to 30 s.
        until_ok(lambda: driver.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60),
            deadline=90, also=(grpc.StatusCode.FAILED_PRECONDITION,))
    assert wait_for_pool(ceph_cluster, baseline) == baseline


def test_sources_of_an_abandoned_create_can_still_be_deleted(
        fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster) -> None:
    """A create killed with its sources in the RBD group, which the CO then gives up on (the
    VolumeGroupSnapshot deleted before it ever got an id, so no DeleteVolumeGroupSnapshot comes):
    DeleteVolume of each source must still work instead of failing on the group membership.
    Tentacle's librbd refuses to move a group member to the trash (EMLINK), so DeleteVolume
    takes the image out of the driver's temporary group first."""
    driver = fresh_driver()
    sources = [driver.controller.CreateVolume(create_request(ceph_cluster, size=SIZE), timeout=60).volume.volume_id
               for _ in range(2)]
    doomed = fresh_driver(env={"CEPHCSI_FAILPOINTS": "group.after-rbd-group"})
    with pytest.raises(grpc.RpcError) as error:
        group_stub(doomed).CreateVolumeGroupSnapshot(group_request(ceph_cluster, sources), timeout=60)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    doomed.cleanup()
    assert len(groups_left(ceph_cluster)[0]) == 1
    for volume_id in sources:
        until_ok(lambda: driver.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60), deadline=90)
    with admin_ioctx(ceph_cluster) as io:
        names = set(rbd.RBD().list(io))
    assert not {image_of(v) for v in sources} & names
