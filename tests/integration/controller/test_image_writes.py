"""CreateVolume writes a new image's objects itself under an id journaled with the record
(cephcsi.ceph.image_create). A create killed before its release leaves that id in the record
(`cephcsi.planned-imageid`) and any subset of the image's three objects; the retried create
completes the volume, and a delete instead removes every trace. A planned id that turns out
taken is replaced."""
from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2
from cephcsi.ceph import encoding, image_create
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.settings import CephSettings
from cephcsi.volumes.journal import PLANNED_IMAGE_ID
from cephcsi.volumes.manager import CreateRequest, VolumeManager
from cephcsi.volumes.parameters import VolumeParameters
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, journal_entries, until_ok
from tests.integration.controller.pool_state import admin_ioctx, read_pool, wait_for_pool
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

OBJECTS = ("directory", "id object", "header")
SHAPES = [frozenset(kept) for n in range(4) for kept in itertools.combinations(OBJECTS, n)]


def _killed_after_the_image(fresh_driver: Callable[..., DriverProcess], request: csi_pb2.CreateVolumeRequest,
                            cluster: CephTestCluster) -> tuple[str, str, str]:
    """(uuid, image name, planned id) of a create killed right after it wrote the image."""
    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": "create.after-image"})
    with pytest.raises(grpc.RpcError) as killed:
        crashing.controller.CreateVolume(request, timeout=60)
    assert killed.value.code() == grpc.StatusCode.UNAVAILABLE, killed.value.details()
    uuid_value, record = journal_entries(cluster, request.name)
    assert uuid_value and record[PLANNED_IMAGE_ID] and "csi.imageid" not in record, record
    return uuid_value, record["csi.imagename"], record[PLANNED_IMAGE_ID]


def _cut_to(cluster: CephTestCluster, name: str, image_id: str, kept: frozenset[str]) -> None:
    """Leave only `kept` of the image's objects: what a kill between the writes can leave."""
    with admin_ioctx(cluster) as io:
        if "id object" not in kept:
            io.remove_object(f"rbd_id.{name}")
        if "header" not in kept:
            io.remove_object(f"rbd_header.{image_id}")
        if "directory" not in kept:
            io.execute("rbd_directory", "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))


@pytest.mark.parametrize("kept", SHAPES, ids=lambda kept: "+".join(sorted(kept)) or "nothing")
def test_a_retried_create_completes_whatever_a_killed_one_wrote(
    kept: frozenset[str], fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    request = create_request(ceph_cluster, imageFeatures="layering,exclusive-lock,object-map,fast-diff")
    _, name, planned = _killed_after_the_image(fresh_driver, request, ceph_cluster)
    _cut_to(ceph_cluster, name, planned, kept)

    healthy = fresh_driver()
    volume = until_ok(lambda: healthy.controller.CreateVolume(request, timeout=60)).volume
    assert image_of(volume.volume_id) == name
    _, record = journal_entries(ceph_cluster, request.name)
    assert PLANNED_IMAGE_ID not in record
    with admin_ioctx(ceph_cluster) as io, rbd.Image(io, name) as image:
        assert record["csi.imageid"] == image.id() == planned
        assert image.size() == request.capacity_range.required_bytes
        assert not image.flags() & rbd.RBD_FLAG_OBJECT_MAP_INVALID
        image.write(b"kept", 0)

    healthy.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id,
                                                                secrets=ceph_cluster.secrets))
    wait_for_pool(ceph_cluster, baseline)


@pytest.mark.parametrize("kept", [frozenset({"header"}), frozenset({"directory", "id object"}), frozenset(OBJECTS)],
                         ids=["header", "names", "complete"])
def test_a_delete_after_a_killed_create_leaves_nothing(
    kept: frozenset[str], fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    """What the provisioner does when the claim went away while its create was failing."""
    baseline = read_pool(ceph_cluster)
    request = create_request(ceph_cluster)
    uuid_value, name, planned = _killed_after_the_image(fresh_driver, request, ceph_cluster)
    _cut_to(ceph_cluster, name, planned, kept)

    healthy = fresh_driver()
    with admin_ioctx(ceph_cluster) as io:
        volume_id = VolumeId(ceph_cluster.cluster_id, io.get_pool_id(), uuid_value).encode()
    until_ok(lambda: healthy.controller.DeleteVolume(
        csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets), timeout=60))
    wait_for_pool(ceph_cluster, baseline)


def test_a_planned_id_found_taken_is_replaced(
    monkeypatch: pytest.MonkeyPatch, ceph_cluster: CephTestCluster, config_file: str, keeper: LeaseKeeper
) -> None:
    """The id the record plans belongs to another image (ids are random: unlikely, not
    impossible): that image is left as it was, and the volume gets a new id, journaled."""
    baseline = read_pool(ceph_cluster)
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    with admin_ioctx(ceph_cluster) as io:
        rbd.RBD().create(io, owner, 8 << 20, old_format=False, features=rbd.RBD_FEATURE_LAYERING)
        with rbd.Image(io, owner) as image:
            taken = image.id()
            image.write(b"owner's", 0)
    ids = iter([taken])
    fresh_id = image_create.new_image_id
    monkeypatch.setattr(image_create, "new_image_id", lambda: next(ids, None) or fresh_id())
    manager = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings()), "default", keeper=keeper)
    request = create_request(ceph_cluster)
    volume = manager.create(CreateRequest(
        name=request.name, parameters=VolumeParameters.parse(dict(request.parameters)),
        size=8 << 20, required_bytes=8 << 20, limit_bytes=0, credentials=Credentials.from_secrets(ceph_cluster.secrets),
    ))
    with admin_ioctx(ceph_cluster) as io:
        with rbd.Image(io, volume.image_name, read_only=True) as image:
            made = image.id()
        with rbd.Image(io, owner, read_only=True) as image:
            assert image.read(0, 7) == b"owner's"
    assert made != taken
    deadline = time.monotonic() + 10  # the id is journaled behind the answer
    while journal_entries(ceph_cluster, request.name)[1].get("csi.imageid") != made:
        assert time.monotonic() < deadline, journal_entries(ceph_cluster, request.name)
        time.sleep(0.05)
    assert PLANNED_IMAGE_ID not in journal_entries(ceph_cluster, request.name)[1]
    manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
    _, record = journal_entries(ceph_cluster, request.name)
    assert record == {}
    with admin_ioctx(ceph_cluster) as io:
        rbd.RBD().remove(io, owner)
    manager.connections.close_all()
    wait_for_pool(ceph_cluster, baseline)


def _created_order(ceph_cluster: CephTestCluster, config_file: str, keeper: LeaseKeeper) -> int:
    """The order of an image a fresh controller (new connections) makes in the test pool."""
    manager = VolumeManager(ClusterRegistry(config_file), ConnectionCache(CephSettings()), "default", keeper=keeper)
    request = create_request(ceph_cluster)
    try:
        volume = manager.create(CreateRequest(
            name=request.name, parameters=VolumeParameters.parse(dict(request.parameters)), size=8 << 20,
            required_bytes=8 << 20, limit_bytes=0, credentials=Credentials.from_secrets(ceph_cluster.secrets),
        ))
        with admin_ioctx(ceph_cluster) as io, rbd.Image(io, volume.image_name, read_only=True) as image:
            order = int(image.stat()["order"])
        manager.delete(volume.volume_id.encode(), dict(ceph_cluster.secrets))
        return order
    finally:
        manager.connections.close_all()


def test_a_pool_override_of_the_image_layout_is_honoured(ceph_cluster: CephTestCluster, config_file: str,
                                                        keeper: LeaseKeeper) -> None:
    """`rbd config pool set <pool> rbd_default_order 23`: librbd would give new images 8 MiB
    objects, so the driver leaves such creates to librbd instead of writing 4 MiB ones."""
    baseline = read_pool(ceph_cluster)
    assert _created_order(ceph_cluster, config_file, keeper) == 22
    with admin_ioctx(ceph_cluster) as io:
        rbd.RBD().config_set(io, "rbd_default_order", "23")
    try:
        assert _created_order(ceph_cluster, config_file, keeper) == 23
    finally:
        with admin_ioctx(ceph_cluster) as io:
            rbd.RBD().config_remove(io, "rbd_default_order")
    assert _created_order(ceph_cluster, config_file, keeper) == 22
    wait_for_pool(ceph_cluster, baseline)
