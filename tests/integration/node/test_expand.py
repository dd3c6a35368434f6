"""NodeExpandVolume and resize-on-stage through a real `cephcsi --mode=node` on real Ceph with
the fuse mapper (rbd-fuse + loop device): the image is grown (as ControllerExpandVolume does),
then the node makes the loop device and the mounted filesystem follow, online, data intact."""
from __future__ import annotations

import os
import time

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.node import devices
from cephcsi.node.mounts import top_mount
from tests.capabilities import can_grow_ext4_online
from tests.integration.node.conftest import NodeEnv, Volume, block_cap, expect_code, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]
MiB = 1 << 20


def grow_image(env: NodeEnv, volume: Volume, size_mb: int) -> None:
    env.cluster.admin("rbd", "resize", "--no-progress", "--size", f"{size_mb}M", f"{env.cluster.pool}/{volume.image}")


def node_expand(env: NodeEnv, volume: Volume, path: str, size_mb: int, staging: str = "",
                cap: csi_pb2.VolumeCapability | None = None) -> int:
    request = csi_pb2.NodeExpandVolumeRequest(
        volume_id=volume.volume_id, volume_path=path, staging_target_path=staging,
        capacity_range=csi_pb2.CapacityRange(required_bytes=size_mb * MiB))
    if cap is not None:
        request.volume_capability.CopyFrom(cap)
    return int(env.node.NodeExpandVolume(request, timeout=120).capacity_bytes)


def fs_bytes(path: str) -> int:
    stat = os.statvfs(path)
    return stat.f_blocks * stat.f_frsize


@pytest.mark.parametrize("fs_type, size_mb, grown_mb", [("ext4", 64, 160), ("xfs", 320, 640)])
def test_mounted_filesystem_grows_online(env: NodeEnv, make_volume, fs_type: str, size_mb: int,  # type: ignore[no-untyped-def]
                                         grown_mb: int) -> None:
    volume: Volume = make_volume(size_mb)
    cap = mount_cap(fs_type)
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    payload = os.urandom(1 << 20)
    with open(os.path.join(target, "data"), "wb") as handle:
        handle.write(payload)
    before = fs_bytes(target)
    grow_image(env, volume, grown_mb)
    if fs_type == "ext4" and not can_grow_ext4_online():
        message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, node_expand, env, volume, target, grown_mb, staging)
        assert "CAP_SYS_RESOURCE" in message
        device = str(top_mount(os.path.join(staging, "fs")).source)  # type: ignore[union-attr]
        assert devices.size_bytes(device) == grown_mb * MiB  # the loop device did follow
        volume.unpublish(target)
        volume.unstage(staging)
        pytest.skip("ext4 online resize needs CAP_SYS_RESOURCE, which this machine's root lacks")

    assert node_expand(env, volume, target, grown_mb, staging, cap) == grown_mb * MiB
    after = fs_bytes(target)
    assert after > before + (grown_mb - size_mb - 32) * MiB, (before, after)
    # Repeated (and without a staging path: found through the mounts): nothing changes.
    assert node_expand(env, volume, target, grown_mb) == grown_mb * MiB
    assert fs_bytes(target) == after
    with open(os.path.join(target, "data"), "rb") as handle:
        assert handle.read() == payload
    # The filesystem stays writable beyond its old end.
    with open(os.path.join(target, "big"), "wb") as handle:
        handle.write(os.urandom((grown_mb - size_mb) * MiB // 2))
    log = env.driver.log()
    assert ("resize2fs" if fs_type == "ext4" else "xfs_growfs") in log and "losetup --set-capacity" in log

    volume.unpublish(target)
    volume.unstage(staging)


def test_block_device_shows_the_new_size(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    cap = block_cap()
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    assert devices.size_bytes(target) == 64 * MiB
    grow_image(env, volume, 96)
    assert node_expand(env, volume, target, 96, staging, cap) == 96 * MiB
    assert devices.size_bytes(target) == 96 * MiB
    volume.unpublish(target)
    volume.unstage(staging)


def test_block_device_follows_the_image_without_a_node_step(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    """ControllerExpandVolume answers node_expansion_required=false for Block, so the CO never
    calls NodeExpandVolume for it: the loop device must follow the image by itself, as krbd and
    rbd-nbd devices do (cephcsi.node.mappers.fuse_capacity)."""
    volume: Volume = make_volume(64)
    cap = block_cap()
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    grow_image(env, volume, 80)
    deadline = time.monotonic() + 30
    while devices.size_bytes(target) != 80 * MiB and time.monotonic() < deadline:
        time.sleep(0.2)
    assert devices.size_bytes(target) == 80 * MiB
    assert "loop device grown to its image's size" in env.driver.log()
    volume.unpublish(target)
    volume.unstage(staging)


@pytest.mark.parametrize("fs_type, size_mb", [("ext4", 64), ("xfs", 320)])
def test_stage_after_an_offline_resize_grows_the_filesystem(env: NodeEnv, make_volume, fs_type: str,  # type: ignore[no-untyped-def]
                                                            size_mb: int) -> None:
    volume: Volume = make_volume(size_mb)
    cap = mount_cap(fs_type)
    staging = env.staging()
    volume.stage(staging, cap)
    before = fs_bytes(os.path.join(staging, "fs"))
    with open(os.path.join(staging, "fs", "data"), "wb") as handle:
        handle.write(b"kept")
    volume.unstage(staging)
    grow_image(env, volume, size_mb + 128)
    volume.stage(staging, cap)
    after = fs_bytes(os.path.join(staging, "fs"))
    # ext4 is grown before the mount, offline: no CAP_SYS_RESOURCE needed (xfs grows mounted).
    assert after > before + 96 * MiB
    with open(os.path.join(staging, "fs", "data"), "rb") as handle:
        assert handle.read() == b"kept"
    if fs_type == "ext4":
        assert "filesystem grown before mounting" in env.driver.log()
    volume.unstage(staging)


def test_expand_errors(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    staging, target = env.staging(), env.target()
    # Nothing staged there.
    expect_code(grpc.StatusCode.NOT_FOUND, node_expand, env, volume, staging, 64, staging)
    expect_code(grpc.StatusCode.NOT_FOUND, node_expand, env, volume, target, 64)
    # Outside the kubelet directory: no volume of ours can be there.
    expect_code(grpc.StatusCode.NOT_FOUND, node_expand, env, volume, "/etc", 64)
    volume.stage(staging, mount_cap("ext4"))
    expect_code(grpc.StatusCode.INVALID_ARGUMENT, node_expand, env, volume, staging, 64, staging, block_cap())
    volume.unstage(staging)
