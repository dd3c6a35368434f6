"""Node RPCs that answer questions or refuse bad requests, through the real plugin process."""
from __future__ import annotations

import os
import subprocess
from typing import Any

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.integration.node.conftest import (
    Mode,
    NodeEnv,
    Volume,
    assert_no_leftovers,
    block_cap,
    expect_code,
    mount_cap,
)

pytestmark = [pytest.mark.integration, pytest.mark.ceph]
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def test_capabilities_and_info(env: NodeEnv) -> None:
    caps = env.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    RPC = csi_pb2.NodeServiceCapability.RPC
    assert {c.rpc.type for c in caps.capabilities} == {
        RPC.STAGE_UNSTAGE_VOLUME, RPC.GET_VOLUME_STATS, RPC.VOLUME_CONDITION, RPC.SINGLE_NODE_MULTI_WRITER,
        RPC.EXPAND_VOLUME,
    }
    info = env.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id == "test-node" and info.max_volumes_per_node == 0
    assert not info.HasField("accessible_topology")
    plugin = env.driver.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert list(plugin.capabilities) == []  # node mode: no controller, no topology without --domainlabels
    # Expansion is served now; a path outside the kubelet dir holds no volume of ours.
    expect_code(grpc.StatusCode.NOT_FOUND, env.node.NodeExpandVolume,
                csi_pb2.NodeExpandVolumeRequest(volume_id="x", volume_path="/x"))


def test_volume_stats(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    staging, target = env.staging(), env.target()
    volume.stage(staging, mount_cap())
    volume.publish(staging, target, mount_cap())
    with open(os.path.join(target, "blob"), "wb") as handle:
        handle.write(os.urandom(4 << 20))
        os.fsync(handle.fileno())

    def stats(path: str) -> csi_pb2.NodeGetVolumeStatsResponse:
        response: csi_pb2.NodeGetVolumeStatsResponse = env.node.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=path))
        return response

    for path in (target, staging):  # the target, or the staging path (resolved through its record)
        response = stats(path)
        usage = {u.unit: u for u in response.usage}
        size = usage[csi_pb2.VolumeUsage.Unit.BYTES]
        inodes = usage[csi_pb2.VolumeUsage.Unit.INODES]
        assert 50 << 20 < size.total <= volume.size
        assert size.used >= 4 << 20 and size.available > 0 and size.available < size.total
        assert inodes.total > 0 and inodes.used >= 12 and inodes.available > 0
        assert not response.volume_condition.abnormal

    # Not a volume: NOT_FOUND (csi-sanity checks both of these).
    expect_code(grpc.StatusCode.NOT_FOUND, stats, os.path.join(env.kubelet, "nothing-here"))
    os.makedirs(os.path.join(env.kubelet, "pods", "empty-dir"))
    expect_code(grpc.StatusCode.NOT_FOUND, stats, os.path.join(env.kubelet, "pods", "empty-dir"))
    expect_code(grpc.StatusCode.NOT_FOUND, stats, "some/path")
    expect_code(grpc.StatusCode.NOT_FOUND, env.node.NodeGetVolumeStats,
                csi_pb2.NodeGetVolumeStatsRequest(volume_id="fake-vol-id-1", volume_path=target))

    # The staging mount vanished under us: abnormal, with a message saying so.
    volume.unpublish(target)
    subprocess.run(["umount", os.path.join(staging, "fs")], check=True)
    response = stats(staging)
    assert response.volume_condition.abnormal and "not mounted" in response.volume_condition.message
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_block_stats_and_device_gone(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(32)
    staging, target = env.staging(), env.target()
    volume.stage(staging, block_cap())
    volume.publish(staging, target, block_cap())
    response = env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=target))
    assert [(u.unit, u.total) for u in response.usage] == [(csi_pb2.VolumeUsage.Unit.BYTES, 32 << 20)]
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def _stage(env: NodeEnv, volume: Volume, staging: str, **changes: object) -> csi_pb2.NodeStageVolumeRequest:
    request = volume.stage_request(staging, mount_cap())
    for key, value in changes.items():
        if key == "volume_context":
            assert isinstance(value, dict)
            request.volume_context.clear()
            request.volume_context.update(value)
        elif key == "secrets":
            assert isinstance(value, dict)
            request.secrets.clear()
            request.secrets.update(value)
        elif key == "volume_capability":
            if value is None:
                request.ClearField("volume_capability")
            else:
                assert isinstance(value, csi_pb2.VolumeCapability)
                request.volume_capability.CopyFrom(value)
        else:
            setattr(request, key, value)
    return request


def test_stage_refusals(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    staging = env.staging()
    cases: list[tuple[dict[str, object], grpc.StatusCode, str]] = [
        (dict(volume_id=""), INVALID, "volume_id is required"),
        (dict(staging_target_path=""), INVALID, "staging_target_path is required"),
        (dict(staging_target_path="/etc/cephcsi-test"), INVALID, "not inside the kubelet directory"),
        (dict(staging_target_path=env.kubelet + "/st/../../x"), INVALID, "'..'"),
        (dict(volume_capability=None), INVALID, "volume_capability is required"),
        (dict(volume_capability=mount_cap("ntfs")), INVALID, "'ntfs' is not supported"),
        (dict(volume_capability=mount_cap(mode=Mode.MULTI_NODE_MULTI_WRITER)), INVALID, "block"),
        (dict(volume_id="fake-vol-id-abc"), grpc.StatusCode.NOT_FOUND, "does not exist"),
        (dict(volume_context={"clusterID": env.cluster.cluster_id, "pool": env.cluster.pool}), INVALID, "imageName"),
        (dict(secrets={}), INVALID, "userID and userKey"),
        (dict(secrets={"userID": "csi", "userKey": "bm90LWEta2V5"}), INVALID, "userKey"),
        (dict(volume_context={**volume.context, "mounter": "ggate"}), INVALID, "unknown mounter"),
        (dict(volume_context={**volume.context, "mapOptions": "rbd:x"}), INVALID, "unknown mapper type"),
        (dict(volume_context={**volume.context, "imageName": "no-such-image"}), grpc.StatusCode.NOT_FOUND, "does not exist"),
    ]
    for changes, code, text in cases:
        message = expect_code(code, env.node.NodeStageVolume, _stage(env, volume, staging, **changes))
        assert text in message, (changes, message)
        assert env.cluster.key not in message
    unknown = VolumeId("no-such-cluster", 1, VolumeId.new_uuid()).encode()
    expect_code(grpc.StatusCode.NOT_FOUND, env.node.NodeStageVolume,
                _stage(env, volume, staging, volume_id=unknown, volume_context={"pool": "rbd", "imageName": volume.image}))
    assert os.listdir(staging) == []
    assert_no_leftovers(env, volume)
    assert env.cluster.key not in env.driver.log()


def test_wrong_key_is_permission_denied(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    staging = env.staging()
    wrong = subprocess.run(["ceph-authtool", "--gen-print-key"], capture_output=True, text=True, check=True).stdout.strip()
    message = expect_code(
        grpc.StatusCode.PERMISSION_DENIED, env.node.NodeStageVolume,
        _stage(env, volume, staging, secrets={"userID": env.cluster.user, "userKey": wrong}),
    )
    assert "credentials" in message and wrong not in message
    assert wrong not in env.driver.log()
    assert os.listdir(staging) == []
    assert_no_leftovers(env, volume)


def test_publish_unpublish_unstage_refusals(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    staging, target = env.staging(), env.target()
    publish = env.node.NodePublishVolume
    base: dict[str, Any] = dict(volume_id=volume.volume_id, staging_target_path=staging, target_path=target,
                                volume_capability=mount_cap())
    for field, text in (("volume_id", "volume_id is required"), ("target_path", "target_path is required"),
                        ("staging_target_path", "staging_target_path is required")):
        message = expect_code(INVALID, publish, csi_pb2.NodePublishVolumeRequest(**{**base, field: ""}))
        assert text in message
    expect_code(INVALID, publish, csi_pb2.NodePublishVolumeRequest(**{k: v for k, v in base.items() if k != "volume_capability"}))
    expect_code(INVALID, publish, csi_pb2.NodePublishVolumeRequest(**{**base, "target_path": "/tmp/outside"}))
    expect_code(grpc.StatusCode.NOT_FOUND, publish, csi_pb2.NodePublishVolumeRequest(**{**base, "volume_id": "fake-vol-id"}))
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, publish, csi_pb2.NodePublishVolumeRequest(**base))
    assert not os.path.exists(target)

    unpublish = env.node.NodeUnpublishVolume
    expect_code(INVALID, unpublish, csi_pb2.NodeUnpublishVolumeRequest(target_path=target))
    expect_code(INVALID, unpublish, csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.volume_id))
    expect_code(INVALID, unpublish, csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.volume_id, target_path="rel/x"))
    unstage = env.node.NodeUnstageVolume
    expect_code(INVALID, unstage, csi_pb2.NodeUnstageVolumeRequest(staging_target_path=staging))
    expect_code(INVALID, unstage, csi_pb2.NodeUnstageVolumeRequest(volume_id=volume.volume_id))
    expect_code(INVALID, unstage, csi_pb2.NodeUnstageVolumeRequest(volume_id=volume.volume_id, staging_target_path="/etc"))
    stats = env.node.NodeGetVolumeStats
    expect_code(INVALID, stats, csi_pb2.NodeGetVolumeStatsRequest(volume_path=target))
    expect_code(INVALID, stats, csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id))
    # A target that is a plain directory with files in it is never deleted by unpublish.
    os.makedirs(target)
    with open(os.path.join(target, "user-file"), "w") as handle:
        handle.write("not ours")
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, unpublish,
                csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume.volume_id, target_path=target))
    assert os.path.exists(os.path.join(target, "user-file"))
