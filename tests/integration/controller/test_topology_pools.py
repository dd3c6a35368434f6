"""`topologyConstrainedPools` on the real cluster: a CreateVolume with accessibility requirements
lands, journal and image, in the pool of the matching zone (ceph-csi ≥ 3.11's layout), a retry
with the requirements reordered finds it, a restore stays in its source's pool while a volume
clone is placed by its requirements (cloned across pools, as ceph-csi places it), and a delete
leaves neither pool anything of it. The pools are the suite's two (tests/ceph/cluster.sh):
zone `a` → `pool2` with `pool` as its data pool, zone `b` → `pool`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster, read_omap
from tests.integration.controller.helpers import create_request, until_ok
from tests.integration.controller.snapshot_helpers import from_snapshot, pattern, snapshot_request, wait_for
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

ZONE = "topology.rbd.csi.ceph.com/zone"


@pytest.fixture(scope="module")
def admin(ceph_cluster: CephTestCluster) -> Iterator[Any]:
    import rados

    client = rados.Rados(rados_id="admin", conf={"mon_host": ceph_cluster.mon_host, "key": ceph_cluster.admin_key})
    client.connect(timeout=30)
    yield client
    client.shutdown()


def _omap(admin: Any, pool: str, obj: str) -> dict[str, str]:
    io = admin.open_ioctx(pool)
    try:
        return read_omap(io, obj)
    finally:
        io.close()


def _pools(cluster: CephTestCluster) -> str:
    return json.dumps([
        {"poolName": cluster.pool2, "dataPool": cluster.pool,
         "domainSegments": [{"domainLabel": "region", "value": "r1"}, {"domainLabel": "zone", "value": "a"}]},
        {"poolName": cluster.pool, "domainSegments": [{"domainLabel": "zone", "value": "b"}]},
    ])


def _zone(zone: str) -> csi_pb2.Topology:
    return csi_pb2.Topology(segments={ZONE: zone, "topology.rbd.csi.ceph.com/region": "r1"})


def _request(cluster: CephTestCluster, preferred: list[str], requisite: list[str], name: str | None = None,
             pools: str | None = None) -> csi_pb2.CreateVolumeRequest:
    request = create_request(cluster, name=name, topologyConstrainedPools=pools or _pools(cluster))
    request.accessibility_requirements.preferred.extend(_zone(z) for z in preferred)
    request.accessibility_requirements.requisite.extend(_zone(z) for z in requisite)
    return request


def _image_info(cluster: CephTestCluster, pool: str, image: str) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(cluster.admin("rbd", "info", "--format", "json", f"{pool}/{image}"))
    return info


def _entry(admin: Any, pool: str, name: str) -> tuple[str | None, dict[str, str]]:
    value = _omap(admin, pool, "csi.volumes.default").get(f"csi.volume.{name}")
    return value, (_omap(admin, pool, f"csi.volume.{value}") if value else {})


def _delete(driver: DriverProcess, cluster: CephTestCluster, volume_id: str) -> None:
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=cluster.secrets),
                                   timeout=60)


def _assert_gone(admin: Any, cluster: CephTestCluster, name: str, image: str) -> None:
    for pool in (cluster.pool, cluster.pool2):
        assert _entry(admin, pool, name) == (None, {}), pool
        assert image not in json.loads(cluster.admin("rbd", "ls", "-p", pool, "--format", "json") or "[]"), pool


def test_each_zone_lands_in_its_pool_a_retry_finds_it_and_delete_leaves_nothing(
    driver: DriverProcess, ceph_cluster: CephTestCluster, admin: Any
) -> None:
    cluster = ceph_cluster
    pool_ids = {pool: admin.pool_lookup(pool) for pool in (cluster.pool, cluster.pool2)}
    # (preferred, requisite) → pool, data pool, accessible zone: preferred wins over requisite and
    # over the order of the pools; requisite alone also chooses.
    cases = [(["a", "b"], ["b"], cluster.pool2, cluster.pool, "a"),
             (["b"], ["a", "b"], cluster.pool, "", "b"),
             ([], ["c", "a"], cluster.pool2, cluster.pool, "a")]
    for preferred, requisite, pool, data_pool, zone in cases:
        request = _request(cluster, preferred, requisite)
        volume = driver.controller.CreateVolume(request, timeout=60).volume
        volume_id = VolumeId.decode(volume.volume_id)
        image = volume.volume_context["imageName"]
        assert volume_id.pool_id == pool_ids[pool]
        assert volume.volume_context["pool"] == pool
        assert volume.volume_context.get("dataPool", "") == data_pool
        assert [dict(t.segments) for t in volume.accessible_topology] == [dict(_zone(zone).segments)]
        # Journal and image in the chosen pool only (ceph-csi ≥ 3.11 journals there too).
        value, record = _entry(admin, pool, request.name)
        assert value == volume_id.object_uuid and record["csi.imagename"] == image
        other = cluster.pool if pool == cluster.pool2 else cluster.pool2
        assert _entry(admin, other, request.name) == (None, {})
        info = _image_info(cluster, pool, image)
        assert info.get("data_pool", "") == data_pool

        # The retry of a provisioner whose node choice reordered the requirements: same volume.
        retry = _request(cluster, list(reversed(preferred)), list(reversed(requisite)), name=request.name)
        assert driver.controller.CreateVolume(retry, timeout=60).volume.volume_id == volume.volume_id
        _delete(driver, cluster, volume.volume_id)
        _assert_gone(admin, cluster, request.name, image)


def test_no_matching_pool_is_resource_exhausted_and_reserves_nothing(
    driver: DriverProcess, ceph_cluster: CephTestCluster, admin: Any
) -> None:
    request = _request(ceph_cluster, ["c"], ["c", "d"])
    with pytest.raises(grpc.RpcError) as caught:
        driver.controller.CreateVolume(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "topologyConstrainedPools" in (caught.value.details() or "")
    for pool in (ceph_cluster.pool, ceph_cluster.pool2):
        assert _entry(admin, pool, request.name) == (None, {})


@pytest.mark.parametrize("pools, fragment", [
    ("[{\"poolName\": ", "not valid JSON"),
    ("[{\"domainSegments\": [{\"domainLabel\": \"zone\", \"value\": \"a\"}]}]", "poolName"),
    ("[{\"poolName\": \"p\"}]", "domainSegments"),
    ("[{\"poolName\": \"p\", \"domainSegments\": [{\"value\": \"a\"}]}]", "domainLabel"),
], ids=["json", "poolName", "domainSegments", "domainLabel"])
def test_a_malformed_parameter_is_invalid_argument(
    driver: DriverProcess, ceph_cluster: CephTestCluster, pools: str, fragment: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        driver.controller.CreateVolume(_request(ceph_cluster, ["a"], [], pools=pools), timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (caught.value.details() or "")


def test_a_restore_stays_in_its_sources_pool_or_is_refused(
    driver: DriverProcess, ceph_cluster: CephTestCluster, admin: Any
) -> None:
    cluster = ceph_cluster
    source = driver.controller.CreateVolume(_request(cluster, ["a"], ["a"]), timeout=60).volume
    snapshot = driver.controller.CreateSnapshot(snapshot_request(cluster, source.volume_id), timeout=60).snapshot
    try:
        restore = from_snapshot(cluster, snapshot.snapshot_id)
        restore.parameters["topologyConstrainedPools"] = _pools(cluster)
        restore.accessibility_requirements.preferred.extend([_zone("b"), _zone("a")])
        restored = driver.controller.CreateVolume(restore, timeout=60).volume
        # Zone b is preferred, but the clone can only be in zone a's pool, where its parent is.
        assert restored.volume_context["pool"] == cluster.pool2
        assert [dict(t.segments) for t in restored.accessible_topology] == [dict(_zone("a").segments)]
        _delete(driver, cluster, restored.volume_id)

        elsewhere = from_snapshot(cluster, snapshot.snapshot_id)
        elsewhere.parameters["topologyConstrainedPools"] = _pools(cluster)
        elsewhere.accessibility_requirements.requisite.append(_zone("b"))
        with pytest.raises(grpc.RpcError) as caught:
            driver.controller.CreateVolume(elsewhere, timeout=60)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _entry(admin, cluster.pool, elsewhere.name) == (None, {})
    finally:
        driver.controller.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot.snapshot_id,
                                                                       secrets=cluster.secrets), timeout=60)
        _delete(driver, cluster, source.volume_id)


def test_a_create_killed_after_its_reservation_is_finished_in_that_pool_whatever_the_retry_prefers(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, admin: Any
) -> None:
    cluster = ceph_cluster
    request = _request(cluster, ["a"], ["a", "b"])
    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": "create.after-reserve"})
    with pytest.raises(grpc.RpcError) as caught:
        crashing.controller.CreateVolume(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    reserved, _ = _entry(admin, cluster.pool2, request.name)
    assert reserved is not None

    # The rescheduled claim now prefers zone b: the name reserved in zone a's pool still wins,
    # so one name never makes two volumes.
    healthy = fresh_driver()
    retry = _request(cluster, ["b"], ["b", "a"], name=request.name)
    volume = until_ok(lambda: healthy.controller.CreateVolume(retry, timeout=60)).volume
    assert volume.volume_context["pool"] == cluster.pool2 and volume.volume_id.endswith(reserved)
    assert [dict(t.segments) for t in volume.accessible_topology] == [dict(_zone("a").segments)]
    assert _entry(admin, cluster.pool, request.name) == (None, {})
    _delete(healthy, cluster, volume.volume_id)
    _assert_gone(admin, cluster, request.name, volume.volume_context["imageName"])


@pytest.mark.parametrize("failpoint", ["create.after-reserve", "create.after-record"])
def test_a_reservation_without_an_image_follows_a_claim_rescheduled_to_another_zone(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, admin: Any, failpoint: str
) -> None:
    """A create killed before its image (name only, or name and record: as a quota failure
    leaves it) in zone a's pool, retried for zone b alone: released there, made in zone b's."""
    cluster = ceph_cluster
    request = _request(cluster, ["a"], ["a"])
    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": failpoint})
    with pytest.raises(grpc.RpcError) as caught:
        crashing.controller.CreateVolume(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    reserved, record = _entry(admin, cluster.pool2, request.name)
    assert reserved is not None and bool(record) == (failpoint == "create.after-record")

    healthy = fresh_driver()
    retry = _request(cluster, ["b"], ["b"], name=request.name)
    volume = until_ok(lambda: healthy.controller.CreateVolume(retry, timeout=60)).volume
    assert volume.volume_context["pool"] == cluster.pool and not volume.volume_id.endswith(reserved)
    assert [dict(t.segments) for t in volume.accessible_topology] == [dict(_zone("b").segments)]
    assert _entry(admin, cluster.pool2, request.name) == (None, {})
    assert _omap(admin, cluster.pool2, f"csi.volume.{reserved}") == {}
    _delete(healthy, cluster, volume.volume_id)
    _assert_gone(admin, cluster, request.name, volume.volume_context["imageName"])


def test_a_retry_in_a_class_pool_that_is_a_topology_pool_keeps_that_entrys_topology(
    driver: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    """Zone b's pool is the class's `pool`; the class names a dataPool zone b's entry has not."""
    request = _request(ceph_cluster, ["b"], [])
    request.parameters["dataPool"] = ceph_cluster.pool2
    first = driver.controller.CreateVolume(request, timeout=60).volume
    again = driver.controller.CreateVolume(request, timeout=60).volume
    try:
        assert first.volume_id == again.volume_id and again.volume_context["pool"] == ceph_cluster.pool
        assert [dict(t.segments) for t in again.accessible_topology] == [dict(_zone("b").segments)]
        assert again.volume_context.get("dataPool", "") == first.volume_context.get("dataPool", "") == ""
    finally:
        _delete(driver, ceph_cluster, first.volume_id)


def test_the_provisioners_find_looks_in_every_topology_pool(
    driver: DriverProcess, ceph_cluster: CephTestCluster, config_file: str
) -> None:
    """A claim deleted before its PV existed: the provisioner finds the volume by name to delete it."""
    from cephcsi.ceph.credentials import Credentials
    from cephcsi.ceph.leases import LeaseKeeper
    from cephcsi.cli.wiring import build_controller
    from cephcsi.config.clusters import ClusterRegistry
    from cephcsi.settings import Settings
    from cephcsi.volumes.parameters import VolumeParameters

    request = _request(ceph_cluster, ["a"], [])
    volume = driver.controller.CreateVolume(request, timeout=60).volume
    keeper = LeaseKeeper()
    servicer = build_controller(Settings(mode="controller", config_file=config_file),
                                ClusterRegistry(config_file), keeper)
    try:
        found = servicer.volumes.find(request.name, VolumeParameters.parse(request.parameters),
                                      Credentials.from_secrets(ceph_cluster.secrets))
        assert found == volume.volume_id
        assert servicer.volumes.find("pvc-none", VolumeParameters.parse(request.parameters),
                                     Credentials.from_secrets(ceph_cluster.secrets)) is None
    finally:
        servicer.volumes.connections.close_all()
        keeper.drain(5)
        _delete(driver, ceph_cluster, volume.volume_id)


def _write(admin: Any, pool: str, image: str, data: bytes) -> None:
    with admin.open_ioctx(pool) as io, rbd.Image(io, image) as opened:
        opened.write(data, 0)
        opened.flush()


def _read(admin: Any, pool: str, image: str, length: int) -> bytes:
    with admin.open_ioctx(pool) as io, rbd.Image(io, image, read_only=True) as opened:
        return bytes(opened.read(0, length))


def _trash_names(cluster: CephTestCluster, pool: str) -> set[str]:
    # --all: a parent deleted while clones read through it is a USER_PARENT entry.
    entries = json.loads(cluster.admin("rbd", "trash", "ls", "--all", "-p", pool, "--format", "json") or "[]")
    return {str(entry["name"]) for entry in entries}


def _nothing_left(admin: Any, cluster: CephTestCluster, volumes: dict[str, str], uuids: list[str]) -> bool:
    """No name key, record, image or trash entry of these volumes (request name → image) in either pool."""
    for pool in (cluster.pool, cluster.pool2):
        images = set(json.loads(cluster.admin("rbd", "ls", "-p", pool, "--format", "json") or "[]"))
        if (images | _trash_names(cluster, pool)) & set(volumes.values()):
            return False
        if any(_entry(admin, pool, name) != (None, {}) for name in volumes):
            return False
        if any(_omap(admin, pool, f"csi.volume.{uuid}") for uuid in uuids):
            return False
    return True


def test_a_volume_clone_is_placed_by_its_requirements_and_cloned_across_pools(
    driver: DriverProcess, ceph_cluster: CephTestCluster, admin: Any
) -> None:
    """A source in zone a's pool cloned for zone b: the clone is zone b's, with the source's
    bytes, and outlives its source; deleting both leaves neither pool anything of them."""
    cluster = ceph_cluster
    pool_ids = {pool: admin.pool_lookup(pool) for pool in (cluster.pool, cluster.pool2)}
    source_request = _request(cluster, ["a"], ["a"])
    source = driver.controller.CreateVolume(source_request, timeout=60).volume
    source_image = source.volume_context["imageName"]
    assert source.volume_context["pool"] == cluster.pool2
    data = pattern("topology clone source", 1024 * 1024)
    _write(admin, cluster.pool2, source_image, data)

    request = _request(cluster, [], ["b"])
    request.volume_content_source.volume.volume_id = source.volume_id
    volumes = {source_request.name: source_image}
    uuids = [VolumeId.decode(source.volume_id).object_uuid]
    left = [source.volume_id]  # deleted in `finally` when an assertion stops the test first
    try:
        clone = driver.controller.CreateVolume(request, timeout=60).volume
        left.insert(0, clone.volume_id)
        clone_id = VolumeId.decode(clone.volume_id)
        image = clone.volume_context["imageName"]
        volumes[request.name] = image
        uuids.append(clone_id.object_uuid)
        assert clone_id.pool_id == pool_ids[cluster.pool]
        assert clone.volume_context["pool"] == cluster.pool
        assert clone.volume_context.get("dataPool", "") == ""
        assert [dict(t.segments) for t in clone.accessible_topology] == [dict(_zone("b").segments)]
        value, record = _entry(admin, cluster.pool, request.name)
        assert value == clone_id.object_uuid and record["csi.imagename"] == image
        assert _entry(admin, cluster.pool2, request.name) == (None, {})
        # A clone v2 across pools (not a copy): it reads through its source's pool.
        parent = _image_info(cluster, cluster.pool, image)["parent"]
        assert (parent["pool"], parent["image"]) == (cluster.pool2, source_image)
        assert _read(admin, cluster.pool, image, len(data)) == data
        # The temporary snapshot is in the trash namespace only: nothing of the cut is left in view.
        assert json.loads(cluster.admin("rbd", "snap", "ls", "--format", "json", f"{cluster.pool2}/{source_image}")) == []
        # The retry of the same request: the same clone.
        assert driver.controller.CreateVolume(request, timeout=60).volume.volume_id == clone.volume_id

        _delete(driver, cluster, source.volume_id)
        left.remove(source.volume_id)
        assert _entry(admin, cluster.pool2, source_request.name) == (None, {})
        assert source_image in _trash_names(cluster, cluster.pool2)  # kept for its clone
        assert _read(admin, cluster.pool, image, len(data)) == data

        _delete(driver, cluster, clone.volume_id)
        left.remove(clone.volume_id)
        # librbd purges the source's image with its last clone.
        assert wait_for(lambda: _nothing_left(admin, cluster, volumes, uuids), timeout=60), \
            {pool: _trash_names(cluster, pool) for pool in (cluster.pool, cluster.pool2)}
    finally:
        for volume_id in left:
            _delete(driver, cluster, volume_id)


def test_a_volume_clone_whose_requirements_match_no_pool_is_resource_exhausted(
    driver: DriverProcess, ceph_cluster: CephTestCluster, admin: Any
) -> None:
    cluster = ceph_cluster
    source = driver.controller.CreateVolume(_request(cluster, ["a"], ["a"]), timeout=60).volume
    try:
        request = _request(cluster, ["c"], ["c", "d"])
        request.volume_content_source.volume.volume_id = source.volume_id
        with pytest.raises(grpc.RpcError) as caught:
            driver.controller.CreateVolume(request, timeout=60)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "topologyConstrainedPools" in (caught.value.details() or "")
        for pool in (cluster.pool, cluster.pool2):
            assert _entry(admin, pool, request.name) == (None, {})
        # Refused before the cut: no snapshot of any namespace on the source.
        with admin.open_ioctx(cluster.pool2) as io, \
                rbd.Image(io, source.volume_context["imageName"], read_only=True) as image:
            assert list(image.list_snaps()) == []
    finally:
        _delete(driver, cluster, source.volume_id)
