"""ControllerExpandVolume through the real gRPC socket against the real Ceph cluster."""
from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, block_cap, create_request, image_of, mount_cap, until_ok
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def _size(cluster: CephTestCluster, image: str) -> int:
    return int(json.loads(cluster.admin("rbd", "info", "--format", "json", f"{cluster.pool}/{image}"))["size"])


def _expand(cluster: CephTestCluster, volume_id: str, required: int, limit: int = 0,
            cap: csi_pb2.VolumeCapability | None = None) -> csi_pb2.ControllerExpandVolumeRequest:
    return csi_pb2.ControllerExpandVolumeRequest(
        volume_id=volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=required, limit_bytes=limit),
        secrets=cluster.secrets, volume_capability=cap or mount_cap())


def _code(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), str(caught.value.details())


def test_expand_grows_rounds_is_idempotent_and_never_shrinks(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    caps = driver.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest()).capabilities
    assert csi_pb2.ControllerServiceCapability.RPC.EXPAND_VOLUME in [c.rpc.type for c in caps]
    volume = driver.controller.CreateVolume(create_request(ceph_cluster, size=8 * MiB)).volume
    image = image_of(volume.volume_id)
    try:
        grown = driver.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 16 * MiB + 1))
        assert (grown.capacity_bytes, grown.node_expansion_required) == (17 * MiB, True)
        assert _size(ceph_cluster, image) == 17 * MiB
        again = driver.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 17 * MiB))
        assert again.capacity_bytes == 17 * MiB
        smaller = driver.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 8 * MiB))
        assert smaller.capacity_bytes == 17 * MiB  # already larger: OK with the current size
        code, message = _code(lambda: driver.controller.ControllerExpandVolume(
            _expand(ceph_cluster, volume.volume_id, 8 * MiB, limit=9 * MiB)))
        assert code == grpc.StatusCode.OUT_OF_RANGE and "never shrunk" in message
        block = driver.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 32 * MiB, cap=block_cap()))
        assert (block.capacity_bytes, block.node_expansion_required) == (32 * MiB, False)
        assert _size(ceph_cluster, image) == 32 * MiB
    finally:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_expand_errors(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    missing = "0001-0004-" + ceph_cluster.cluster_id + "-0000000000000001-00000000-0000-4000-8000-000000000000"
    assert _code(lambda: driver.controller.ControllerExpandVolume(_expand(ceph_cluster, missing, MiB)))[0] == \
        grpc.StatusCode.NOT_FOUND
    assert _code(lambda: driver.controller.ControllerExpandVolume(_expand(ceph_cluster, "fake-vol-id", MiB)))[0] == \
        grpc.StatusCode.NOT_FOUND
    no_range = csi_pb2.ControllerExpandVolumeRequest(volume_id=missing, secrets=ceph_cluster.secrets)
    assert _code(lambda: driver.controller.ControllerExpandVolume(no_range))[0] == grpc.StatusCode.INVALID_ARGUMENT
    # No lock object was left behind for the id that does not exist.
    assert "csi.volume.00000000-0000-4000-8000-000000000000" not in ceph_cluster.admin(
        "rados", "-p", ceph_cluster.pool, "ls").split()


def test_expand_killed_after_the_resize_is_answered_by_the_retry(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    healthy = fresh_driver()
    volume = healthy.controller.CreateVolume(create_request(ceph_cluster, size=8 * MiB)).volume
    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": "expand.after-resize"})
    code, _ = _code(lambda: crashing.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 24 * MiB),
                                                                         timeout=60))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert crashing.process is not None and crashing.process.wait(10) == -9
    # The killed driver's journal lease lapses (2 s): until then the volume answers ABORTED.
    response = until_ok(lambda: healthy.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 24 * MiB)))
    assert response.capacity_bytes == 24 * MiB and _size(ceph_cluster, image_of(volume.volume_id)) == 24 * MiB
    healthy.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_expand_never_grows_an_image_that_is_not_the_volumes(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    """The id and size checks run inside the read-write open that resizes: a missing image is
    NOT_FOUND, and an image under the volume's name with another id than the journal records
    is refused (INTERNAL) and left at its size."""
    volume = driver.controller.CreateVolume(create_request(ceph_cluster, size=8 * MiB)).volume
    image, aside = image_of(volume.volume_id), f"{image_of(volume.volume_id)}-aside"
    ceph_cluster.admin("rbd", "rename", f"{ceph_cluster.pool}/{image}", f"{ceph_cluster.pool}/{aside}")
    try:
        code, message = _code(lambda: driver.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 16 * MiB)))
        assert code == grpc.StatusCode.NOT_FOUND and f"its image {image!r} is gone" in message
        ceph_cluster.admin("rbd", "create", "--size", "8M", f"{ceph_cluster.pool}/{image}")
        try:
            code, message = _code(lambda: driver.controller.ControllerExpandVolume(
                _expand(ceph_cluster, volume.volume_id, 16 * MiB)))
            assert code == grpc.StatusCode.INTERNAL and "run `cephcsi audit` before expanding it" in message
            assert _size(ceph_cluster, image) == 8 * MiB
        finally:
            ceph_cluster.admin("rbd", "rm", f"{ceph_cluster.pool}/{image}")
    finally:
        ceph_cluster.admin("rbd", "rename", f"{ceph_cluster.pool}/{aside}", f"{ceph_cluster.pool}/{image}")
    grown = driver.controller.ControllerExpandVolume(_expand(ceph_cluster, volume.volume_id, 16 * MiB))
    assert grown.capacity_bytes == 16 * MiB and _size(ceph_cluster, image) == 16 * MiB
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
