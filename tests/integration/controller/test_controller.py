"""Controller service through the real gRPC socket against the real Ceph cluster."""
from __future__ import annotations

import concurrent.futures
import time

import grpc
import pytest
import rbd

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import (
    MiB, Mode, block_cap, create_request, image_of, journal_entries, mount_cap, wait_for_empty_trash,
)
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def _code(call: object, *args: object, **kwargs: object) -> grpc.StatusCode:
    try:
        call(*args, **kwargs)  # type: ignore[operator]
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_identity(driver: DriverProcess) -> None:
    info = driver.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "rbd.csi.ceph.com" and info.vendor_version
    caps = driver.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest()).capabilities
    assert [c.service.type for c in caps if c.HasField("service")] == [
        csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE, csi_pb2.PluginCapability.Service.GROUP_CONTROLLER_SERVICE]
    assert [c.volume_expansion.type for c in caps if c.HasField("volume_expansion")] == [
        csi_pb2.PluginCapability.VolumeExpansion.ONLINE]
    assert driver.identity.Probe(csi_pb2.ProbeRequest()).ready.value


def test_create_is_idempotent_and_journaled(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster, size=10 * MiB + 1)
    first = driver.controller.CreateVolume(request).volume
    second = driver.controller.CreateVolume(request).volume
    assert first.volume_id == second.volume_id
    assert first.capacity_bytes == 11 * MiB
    image = image_of(first.volume_id)
    assert dict(first.volume_context) == {"clusterID": ceph_cluster.cluster_id, "pool": ceph_cluster.pool, "imageName": image}
    assert ceph_cluster.images().count(image) == 1
    uuid_value, record = journal_entries(ceph_cluster, request.name)
    assert image.endswith(uuid_value or "?")
    assert record["csi.volname"] == request.name and record["csi.imagename"] == image and record["csi.imageid"]
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=first.volume_id, secrets=ceph_cluster.secrets))


def test_concurrent_identical_creates_make_one_image(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster)
    before = set(ceph_cluster.images())

    def create_until_done() -> tuple[str, int]:
        aborted = 0
        while True:
            try:
                return driver.controller.CreateVolume(request, timeout=60).volume.volume_id, aborted
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.ABORTED, error.details()
                aborted += 1
                time.sleep(0.01)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: create_until_done(), range(8)))
    assert len({volume_id for volume_id, _ in results}) == 1
    assert len(set(ceph_cluster.images()) - before) == 1
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=results[0][0], secrets=ceph_cluster.secrets))


def test_same_name_different_size_is_already_exists(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster, size=4 * MiB)
    volume = driver.controller.CreateVolume(request).volume
    bigger = create_request(ceph_cluster, name=request.name, size=64 * MiB)
    with pytest.raises(grpc.RpcError) as caught:
        driver.controller.CreateVolume(bigger)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS and request.name in (caught.value.details() or "")
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))


def test_delete_removes_everything_and_is_idempotent(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster, imageFeatures="layering,exclusive-lock,object-map,fast-diff")
    volume = driver.controller.CreateVolume(request).volume
    image = image_of(volume.volume_id)
    uuid_value, _ = journal_entries(ceph_cluster, request.name)
    delete = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets)
    driver.controller.DeleteVolume(delete)
    driver.controller.DeleteVolume(delete)
    assert image not in ceph_cluster.images()
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    assert f"csi.volume.{uuid_value}" not in ceph_cluster.objects()
    assert wait_for_empty_trash(ceph_cluster, {image}) == []


@pytest.mark.parametrize("volume_id", ["fake-vol-id-abc", "0001-0009-not-there-0000000000000001-8f0da8c2-ec58-4d67-9cf6-8ab296c1115d"])
def test_delete_of_unknown_ids_succeeds(driver: DriverProcess, ceph_cluster: CephTestCluster, volume_id: str) -> None:
    if "not-there" in volume_id:
        # A well-formed id naming a cluster we do not know cannot be verified: refuse, don't pretend.
        assert _code(driver.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets)) == grpc.StatusCode.NOT_FOUND
    else:
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume_id))


def test_delete_of_well_formed_id_with_unknown_uuid_succeeds(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume
    delete = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets)
    driver.controller.DeleteVolume(delete)
    unknown = volume.volume_id[:-12] + "000000000000"
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=unknown, secrets=ceph_cluster.secrets))


def test_delete_refuses_an_image_in_use(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume
    image = image_of(volume.volume_id)
    import rados

    client = rados.Rados(rados_id="admin", conf={"mon_host": ceph_cluster.mon_host, "key": ceph_cluster.admin_key})
    client.connect()
    try:
        with client.open_ioctx(ceph_cluster.pool) as io, rbd.Image(io, image):  # a read-write open is a watcher
            with pytest.raises(grpc.RpcError) as caught:
                driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = caught.value.details() or ""
            # Names the watcher, and says a crashed client's watch expires by itself.
            assert "open read-write by 1 client(s): client." in details
            assert "watch timeout" in details
        assert image in ceph_cluster.images()
    finally:
        client.shutdown()
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
    assert image not in ceph_cluster.images()


def test_validate_volume_capabilities(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume
    validate = driver.controller.ValidateVolumeCapabilities
    ok = validate(csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=volume.volume_id, volume_capabilities=[mount_cap(), block_cap(Mode.MULTI_NODE_MULTI_WRITER)],
        secrets=ceph_cluster.secrets))
    assert len(ok.confirmed.volume_capabilities) == 2
    refused = validate(csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=volume.volume_id, volume_capabilities=[mount_cap(Mode.MULTI_NODE_MULTI_WRITER)], secrets=ceph_cluster.secrets))
    assert not refused.HasField("confirmed") and "Block" in refused.message
    assert _code(validate, csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id="fake-vol-id", volume_capabilities=[mount_cap()], secrets=ceph_cluster.secrets)) == grpc.StatusCode.NOT_FOUND
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
    assert _code(validate, csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=volume.volume_id, volume_capabilities=[mount_cap()], secrets=ceph_cluster.secrets)) == grpc.StatusCode.NOT_FOUND


def test_controller_capabilities(driver: DriverProcess) -> None:
    caps = driver.controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest()).capabilities
    RPC = csi_pb2.ControllerServiceCapability.RPC
    assert {c.rpc.type for c in caps} == {RPC.CREATE_DELETE_VOLUME, RPC.SINGLE_NODE_MULTI_WRITER, RPC.EXPAND_VOLUME,
                                          RPC.CREATE_DELETE_SNAPSHOT, RPC.LIST_SNAPSHOTS, RPC.CLONE_VOLUME,
                                          RPC.PUBLISH_UNPUBLISH_VOLUME, RPC.GET_CAPACITY, RPC.MODIFY_VOLUME}


def _bad_creates(cluster: CephTestCluster) -> list[tuple[str, csi_pb2.CreateVolumeRequest, grpc.StatusCode, str]]:
    good = create_request(cluster)

    def variant(**changes: object) -> csi_pb2.CreateVolumeRequest:
        request = csi_pb2.CreateVolumeRequest()
        request.CopyFrom(good)
        for key, value in changes.items():
            request.ClearField(key)
            if isinstance(value, dict):
                getattr(request, key).update(value)
            elif isinstance(value, list):
                getattr(request, key).extend(value)
            elif value is not None:
                getattr(request, key).CopyFrom(value) if hasattr(value, "DESCRIPTOR") else setattr(request, key, value)
        return request

    C = grpc.StatusCode
    return [
        ("no name", variant(name=""), C.INVALID_ARGUMENT, "name is required"),
        ("no capabilities", variant(volume_capabilities=[]), C.INVALID_ARGUMENT, "volume_capabilities"),
        ("rwx filesystem", variant(volume_capabilities=[mount_cap(Mode.MULTI_NODE_MULTI_WRITER)]), C.INVALID_ARGUMENT, "Block"),
        ("no clusterID", variant(parameters={"pool": cluster.pool}), C.INVALID_ARGUMENT, "clusterID"),
        ("no pool", variant(parameters={"clusterID": cluster.cluster_id}), C.INVALID_ARGUMENT, "pool"),
        ("unknown cluster", variant(parameters={"clusterID": "nope", "pool": cluster.pool}), C.NOT_FOUND, "nope"),
        ("unknown pool", variant(parameters={"clusterID": cluster.cluster_id, "pool": "nopool"}), C.NOT_FOUND, "nopool"),
        ("bad feature", variant(parameters={**cluster.parameters, "imageFeatures": "fast-diff"}), C.INVALID_ARGUMENT, "fast-diff"),
        ("no secrets", variant(secrets={}), C.INVALID_ARGUMENT, "userID"),
        ("bad key", variant(secrets={"userID": "csi", "userKey": "AQnotakey"}), C.INVALID_ARGUMENT, "userKey"),
        ("limit below required", variant(capacity_range=csi_pb2.CapacityRange(required_bytes=10 * MiB, limit_bytes=MiB)), C.OUT_OF_RANGE, "limit"),
        ("no whole MiB", variant(capacity_range=csi_pb2.CapacityRange(required_bytes=MiB + 1, limit_bytes=MiB + 2)), C.OUT_OF_RANGE, "MiB"),
        ("content source", variant(volume_content_source=csi_pb2.VolumeContentSource(
            volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id="x"))), C.NOT_FOUND, "does not exist"),
    ]


def test_bad_create_requests(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    before = ceph_cluster.images()
    for label, request, code, fragment in _bad_creates(ceph_cluster):
        with pytest.raises(grpc.RpcError) as caught:
            driver.controller.CreateVolume(request, timeout=30)
        assert caught.value.code() == code, f"{label}: {caught.value.details()}"
        assert fragment in (caught.value.details() or ""), label
    assert ceph_cluster.images() == before


def test_bad_delete_and_validate_requests(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    C = grpc.StatusCode
    assert _code(driver.controller.DeleteVolume, csi_pb2.DeleteVolumeRequest()) == C.INVALID_ARGUMENT
    assert _code(driver.controller.ValidateVolumeCapabilities, csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_capabilities=[mount_cap()])) == C.INVALID_ARGUMENT
    assert _code(driver.controller.ValidateVolumeCapabilities, csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id="x")) == C.INVALID_ARGUMENT
    # ControllerPublish is implemented (tests/integration/controller/test_publish.py): an empty request is invalid.
    assert _code(driver.controller.ControllerPublishVolume, csi_pb2.ControllerPublishVolumeRequest()) == C.INVALID_ARGUMENT


def test_secrets_never_reach_the_log(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume
    driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
    log = driver.log()
    assert "CreateVolume" in log and "***stripped***" in log
    assert ceph_cluster.key not in log and ceph_cluster.admin_key not in log
