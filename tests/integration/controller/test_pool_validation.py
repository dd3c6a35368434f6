"""The driver's handles skip librbd's per-create pool validation (`rbd_validate_pool=false`) and
check each pool once per connection instead (cephcsi.ceph.pool_validation): a pool nobody has
validated still gets librbd's validation, and a pool that cannot hold RBD images is refused with
FAILED_PRECONDITION, on fresh pools of the real cluster."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
import rados

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

VALIDATED = b"overwrite validated"


@pytest.fixture
def new_pools(ceph_cluster: CephTestCluster) -> Iterator[Callable[[], str]]:
    """Makes pools that nobody has run `rbd pool init` on (tagged for rbd only, as an admin
    who forgot the init leaves them); all are deleted afterwards."""
    made: list[str] = []

    def make() -> str:
        pool = f"fresh-{uuid.uuid4().hex[:8]}"
        ceph_cluster.admin("ceph", "osd", "pool", "create", pool, "8", "8", "replicated")
        made.append(pool)
        ceph_cluster.admin("ceph", "osd", "pool", "application", "enable", pool, "rbd")
        return pool

    yield make
    for pool in made:
        ceph_cluster.admin("ceph", "osd", "pool", "delete", pool, pool, "--yes-i-really-really-mean-it")


def _admin_request(cluster: CephTestCluster, pool: str, **params: str) -> csi_pb2.CreateVolumeRequest:
    # The test's csi user has capabilities on the cluster's two pools only.
    request = create_request(cluster)
    request.parameters.update({"pool": pool, **params})
    request.secrets.clear()
    request.secrets.update({"userID": "admin", "userKey": cluster.admin_key})
    return request


@contextmanager
def _pool_ioctx(cluster: CephTestCluster, pool: str) -> Iterator[rados.Ioctx]:
    client = rados.Rados(rados_id="admin", conf={"mon_host": cluster.mon_host, "key": cluster.admin_key})
    client.connect()
    try:
        with client.open_ioctx(pool) as io:
            yield io
    finally:
        client.shutdown()


def _info(cluster: CephTestCluster, pool: str) -> bytes | None:
    with _pool_ioctx(cluster, pool) as io:
        try:
            return bytes(io.read("rbd_info", 64))
        except rados.ObjectNotFound:
            return None


def _forget_validation(cluster: CephTestCluster, pool: str) -> None:
    with _pool_ioctx(cluster, pool) as io:
        io.remove_object("rbd_info")


def _images(cluster: CephTestCluster, pool: str) -> list[str]:
    return sorted(cluster.admin("rbd", "ls", "-p", pool).split())


def test_a_pool_is_validated_by_librbd_once_then_read_once_per_connection(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, new_pools: Callable[[], str]
) -> None:
    pool = new_pools()
    driver = fresh_driver()
    assert _info(ceph_cluster, pool) is None
    # 1. Never validated: librbd validates it with this create (and records it in rbd_info).
    first = driver.controller.CreateVolume(_admin_request(ceph_cluster, pool), timeout=60).volume
    assert _info(ceph_cluster, pool) == VALIDATED
    # 2. The driver reads rbd_info once and remembers the pool for this connection ...
    second = driver.controller.CreateVolume(_admin_request(ceph_cluster, pool), timeout=60).volume
    # 3. ... so later creates do not validate again: with the record gone, librbd (validating
    # every create by default) would write it back; the driver's creates leave it missing.
    _forget_validation(ceph_cluster, pool)
    third = driver.controller.CreateVolume(_admin_request(ceph_cluster, pool), timeout=60).volume
    assert _info(ceph_cluster, pool) is None
    # A new connection (another driver process) reads the pool again and validates it anew.
    other = fresh_driver()
    fourth = other.controller.CreateVolume(_admin_request(ceph_cluster, pool), timeout=60).volume
    assert _info(ceph_cluster, pool) == VALIDATED
    # (Deleting the pool afterwards removes them.)
    assert _images(ceph_cluster, pool) == sorted(image_of(v.volume_id) for v in (first, second, third, fourth))


def test_the_data_pool_is_the_one_validated(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, new_pools: Callable[[], str]
) -> None:
    """As librbd does: an image with a data pool validates the data pool, not its own pool."""
    metadata_pool, data_pool = new_pools(), new_pools()
    driver = fresh_driver()
    volume = driver.controller.CreateVolume(
        _admin_request(ceph_cluster, metadata_pool, dataPool=data_pool), timeout=60).volume
    assert _info(ceph_cluster, data_pool) == VALIDATED
    assert _info(ceph_cluster, metadata_pool) is None
    assert _images(ceph_cluster, metadata_pool) == [image_of(volume.volume_id)]


def test_a_pool_that_cannot_hold_rbd_images_is_a_failed_precondition(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster, new_pools: Callable[[], str]
) -> None:
    """A pool in pool-snapshot mode (someone ran `ceph osd pool mksnap`) has no self-managed
    snapshots, which RBD needs: librbd's validation refuses it, and the caller is told what to do."""
    pool = new_pools()
    ceph_cluster.admin("ceph", "osd", "pool", "mksnap", pool, "pool-snap")
    driver = fresh_driver()
    for _ in range(2):  # and the same on a retry
        with pytest.raises(grpc.RpcError) as refused:
            driver.controller.CreateVolume(_admin_request(ceph_cluster, pool), timeout=60)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
        details = refused.value.details() or ""
        assert f"pool {pool!r} cannot hold RBD images" in details and "rbd pool init" in details
    assert _images(ceph_cluster, pool) == []
    assert _info(ceph_cluster, pool) is None
