"""ControllerModifyVolume (RBD QoS) and its steps in CreateVolume and ControllerExpandVolume,
through the real gRPC socket against the real Ceph cluster; the limits are read back with the
rbd CLI (`rbd config image ls`, what librbd clients apply) and `rbd image-meta list`."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request, image_of, mount_cap, until_ok
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]
GiB = 1 << 30


def _config(cluster: CephTestCluster, volume_id: str) -> dict[str, str]:
    """The image-level configuration overrides of the volume's image (source `image`)."""
    rows = json.loads(cluster.admin("rbd", "config", "image", "ls", "--format", "json",
                                    f"{cluster.pool}/{image_of(volume_id)}"))
    return {row["name"]: str(row["value"]) for row in rows if row["source"] == "image" and "qos" in row["name"]}


def _meta(cluster: CephTestCluster, volume_id: str) -> dict[str, str]:
    text = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image_of(volume_id)}")
    return dict(json.loads(text)) if text.strip() else {}


def _modify(driver: DriverProcess, cluster: CephTestCluster, volume_id: str, **parameters: str) -> None:
    driver.controller.ControllerModifyVolume(csi_pb2.ControllerModifyVolumeRequest(
        volume_id=volume_id, mutable_parameters=parameters, secrets=cluster.secrets))


@pytest.fixture
def volume(driver: DriverProcess, ceph_cluster: CephTestCluster) -> Iterator[str]:
    made = driver.controller.CreateVolume(create_request(ceph_cluster, size=8 * MiB)).volume
    yield made.volume_id
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=made.volume_id, secrets=ceph_cluster.secrets))


def test_modify_sets_the_limits_librbd_reads_and_is_idempotent(driver: DriverProcess, ceph_cluster: CephTestCluster,
                                                               volume: str) -> None:
    caps = driver.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest()).capabilities
    assert csi_pb2.ControllerServiceCapability.RPC.MODIFY_VOLUME in [c.rpc.type for c in caps]
    _modify(driver, ceph_cluster, volume, baseReadIops="2000", baseWriteBps="104857600")
    assert _config(ceph_cluster, volume) == {"rbd_qos_read_iops_limit": "2000", "rbd_qos_write_bps_limit": "104857600"}
    before = _meta(ceph_cluster, volume)
    _modify(driver, ceph_cluster, volume, baseReadIops="2000", baseWriteBps="104857600")
    assert _meta(ceph_cluster, volume) == before
    # A new class is the whole QoS: a limit it does not name goes, with its stored policy.
    _modify(driver, ceph_cluster, volume, baseIops="500")
    assert _config(ceph_cluster, volume) == {"rbd_qos_iops_limit": "500"}
    assert not [k for k in _meta(ceph_cluster, volume) if "read_iops" in k or "write_bps" in k]


def test_a_bad_class_changes_nothing(driver: DriverProcess, ceph_cluster: CephTestCluster, volume: str) -> None:
    _modify(driver, ceph_cluster, volume, baseIops="500", baseBps="1000")
    before = _meta(ceph_cluster, volume)
    for bad, named in (({"baseIops": "600", "bogus": "1"}, "bogus"), ({"baseIops": "600", "maxBps": "1"}, "maxBps"),
                       ({"baseIops": "lots"}, "baseIops")):
        with pytest.raises(grpc.RpcError) as caught:
            _modify(driver, ceph_cluster, volume, **bad)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in str(caught.value.details())
        assert _meta(ceph_cluster, volume) == before
    with pytest.raises(grpc.RpcError) as caught:
        _modify(driver, ceph_cluster, "0001-0004-" + ceph_cluster.cluster_id +
                "-0000000000000001-00000000-0000-4000-8000-000000000000", baseIops="1")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_create_honours_the_class_and_expand_rescales(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    # The class (mutable_parameters) overrides the StorageClass key by key; each must hold together alone.
    request = create_request(ceph_cluster, size=GiB, BaseReadIops="100", baseWriteIops="50", maxWriteIops="70",
                             writeIopsPerGiB="5", BaseVolSizeBytes=str(GiB))
    request.mutable_parameters.update({"baseReadIops": "200", "readIopsPerGiB": "10", "baseVolSizeBytes": str(GiB)})
    created = driver.controller.CreateVolume(request).volume
    try:
        assert _config(ceph_cluster, created.volume_id) == {"rbd_qos_read_iops_limit": "200",
                                                            "rbd_qos_write_iops_limit": "50"}
        driver.controller.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
            volume_id=created.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=4 * GiB),
            secrets=ceph_cluster.secrets, volume_capability=mount_cap()))
        # 3 GiB above the base size: read 200 + 3*10, write 50 + 3*5 = 65 (under its max 70).
        assert _config(ceph_cluster, created.volume_id) == {"rbd_qos_read_iops_limit": "230",
                                                            "rbd_qos_write_iops_limit": "65"}
        driver.controller.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
            volume_id=created.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=8 * GiB),
            secrets=ceph_cluster.secrets, volume_capability=mount_cap()))
        assert _config(ceph_cluster, created.volume_id) == {"rbd_qos_read_iops_limit": "270",
                                                            "rbd_qos_write_iops_limit": "70"}
    finally:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=created.volume_id,
                                                                   secrets=ceph_cluster.secrets))


def test_modify_killed_between_two_key_writes_is_completed_by_the_retry(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    healthy = fresh_driver()
    created = healthy.controller.CreateVolume(create_request(ceph_cluster, size=8 * MiB)).volume
    try:
        crashing = fresh_driver({"CEPHCSI_FAILPOINTS": "modify.between-keys"})
        with pytest.raises(grpc.RpcError) as caught:
            _modify(crashing, ceph_cluster, created.volume_id, baseIops="300", baseBps="4000")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert crashing.process is not None and crashing.process.wait(10) == -9
        half = _meta(ceph_cluster, created.volume_id)
        assert len([k for k in half if "qos" in k]) == 1  # killed after the first of four keys
        until_ok(lambda: _modify(healthy, ceph_cluster, created.volume_id, baseIops="300", baseBps="4000"))
        assert _config(ceph_cluster, created.volume_id) == {"rbd_qos_iops_limit": "300", "rbd_qos_bps_limit": "4000"}
    finally:
        # The killed driver's watch on the image lasts until the OSD's watch timeout (30 s).
        until_ok(lambda: healthy.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(
            volume_id=created.volume_id, secrets=ceph_cluster.secrets)), deadline=90,
            also=(grpc.StatusCode.FAILED_PRECONDITION,))


def test_a_clone_gets_its_own_class_not_its_sources_limits(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    source_request = create_request(ceph_cluster, size=8 * MiB)
    source_request.mutable_parameters.update({"baseIops": "5", "baseBps": "6"})
    source = driver.controller.CreateVolume(source_request).volume
    made: list[str] = [source.volume_id]
    try:
        assert _config(ceph_cluster, source.volume_id) == {"rbd_qos_iops_limit": "5", "rbd_qos_bps_limit": "6"}
        plain = create_request(ceph_cluster, size=8 * MiB)
        plain.volume_content_source.volume.volume_id = source.volume_id
        clone = driver.controller.CreateVolume(plain).volume
        made.append(clone.volume_id)
        assert _config(ceph_cluster, clone.volume_id) == {}
        assert not [k for k in _meta(ceph_cluster, clone.volume_id) if "qos" in k]
        classed = create_request(ceph_cluster, size=8 * MiB)
        classed.volume_content_source.volume.volume_id = source.volume_id
        classed.mutable_parameters.update({"baseWriteIops": "9"})
        other = driver.controller.CreateVolume(classed).volume
        made.append(other.volume_id)
        assert _config(ceph_cluster, other.volume_id) == {"rbd_qos_write_iops_limit": "9"}
    finally:
        for volume_id in reversed(made):
            until_ok(lambda: driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(
                volume_id=volume_id, secrets=ceph_cluster.secrets)), also=(grpc.StatusCode.FAILED_PRECONDITION,))
