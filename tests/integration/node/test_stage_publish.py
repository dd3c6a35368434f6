"""Stage/publish/unpublish/unstage through a real `cephcsi --mode=node` process, with the fuse
mapper (rbd-fuse + loop device) against the real Ceph test cluster."""
from __future__ import annotations

import errno
import json
import os
import stat
import subprocess

import grpc
import pytest

from cephcsi._generated import csi_pb2

from cephcsi.node.mounts import read_mounts, top_mount
from cephcsi.node.stage_record import RECORD_NAME
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


def _record(staging: str) -> dict[str, object]:
    with open(os.path.join(staging, RECORD_NAME), encoding="utf-8") as handle:
        return dict(json.load(handle))


def _blkid(device: str, tag: str) -> str:
    return subprocess.run(["blkid", "-p", "-s", tag, "-o", "value", device], capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("fs_type, size_mb", [("ext4", 64), ("xfs", 320)])
def test_filesystem_round_trip_keeps_data(env: NodeEnv, make_volume, fs_type: str, size_mb: int) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(size_mb)
    cap = mount_cap(fs_type)
    staging, target = env.staging(), env.target()

    volume.stage(staging, cap)
    record = _record(staging)
    assert record["mapper"] == "fuse"  # auto-selected on this node: no rbd/nbd kernel modules
    device = str(record["device"])
    assert device.startswith("/dev/loop")
    staged = top_mount(os.path.join(staging, "fs"))
    assert staged is not None and staged.fs_type == fs_type and staged.source == device
    if fs_type == "xfs":
        assert "nouuid" in staged.super_options
    uuid_before = _blkid(device, "UUID")
    # The rbd-fuse mount lives under --state-dir, never under the staging path.
    assert all(not m.mount_point.startswith(staging) or m.mount_point == staged.mount_point
               for m in read_mounts() if m.fs_type.startswith("fuse"))

    volume.publish(staging, target, cap)
    with open(os.path.join(target, "data.txt"), "w") as handle:
        handle.write("precious")
    volume.unpublish(target)
    assert not os.path.exists(target)
    volume.unstage(staging)
    assert os.listdir(staging) == []  # record and mount point removed, staging dir left to the CO
    assert_no_leftovers(env, volume)

    volume.stage(staging, cap)  # finds the filesystem: no mkfs
    assert _blkid(str(_record(staging)["device"]), "UUID") == uuid_before
    volume.publish(staging, target, cap)
    with open(os.path.join(target, "data.txt")) as handle:
        assert handle.read() == "precious"
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_block_volume_round_trip(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    cap = block_cap()
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    record = _record(staging)
    assert record["access_type"] == "block" and record["fs_type"] == ""
    volume.publish(staging, target, cap)
    assert stat.S_ISBLK(os.stat(target).st_mode)  # a file the driver created, with the device bound onto it
    pattern = os.urandom(4096)
    fd = os.open(target, os.O_RDWR)
    try:
        assert os.lseek(fd, 0, os.SEEK_END) == volume.size
        os.pwrite(fd, pattern, 1 << 20)
        os.fsync(fd)
    finally:
        os.close(fd)
    stats = env.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=target)
    )
    assert [(u.total, u.unit) for u in stats.usage] == [(volume.size, csi_pb2.VolumeUsage.Unit.BYTES)]
    assert not stats.volume_condition.abnormal
    volume.unpublish(target)
    assert not os.path.exists(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)
    # No filesystem was ever created on a block volume.
    volume.stage(staging, cap)
    assert _blkid(str(_record(staging)["device"]), "TYPE") == ""
    volume.publish(staging, target, cap)
    fd = os.open(target, os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, 1 << 20) == pattern
    finally:
        os.close(fd)
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_never_reformats_a_different_filesystem(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(320)
    staging, target = env.staging(), env.target()
    volume.stage(staging, mount_cap("xfs"))
    volume.publish(staging, target, mount_cap("xfs"))
    with open(os.path.join(target, "keep.txt"), "w") as handle:
        handle.write("xfs data")
    volume.unpublish(target)
    volume.unstage(staging)

    message = expect_code(
        grpc.StatusCode.FAILED_PRECONDITION, env.node.NodeStageVolume, volume.stage_request(staging, mount_cap("ext4"))
    )
    assert "xfs" in message and "refusing to format" in message
    # The failed stage rolled everything back.
    assert os.listdir(staging) == []
    assert_no_leftovers(env, volume)

    volume.stage(staging, mount_cap("xfs"))
    volume.publish(staging, target, mount_cap("xfs"))
    with open(os.path.join(target, "keep.txt")) as handle:
        assert handle.read() == "xfs data"
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_two_publishes_and_read_only(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    cap = mount_cap()
    staging, writer, reader = env.staging(), env.target(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, writer, cap)
    volume.publish(staging, reader, cap, readonly=True)
    with open(os.path.join(writer, "shared.txt"), "w") as handle:
        handle.write("seen by both")
    with open(os.path.join(reader, "shared.txt")) as handle:
        assert handle.read() == "seen by both"
    with pytest.raises(OSError) as caught:
        open(os.path.join(reader, "nope.txt"), "w")
    assert caught.value.errno == errno.EROFS
    reader_mount = top_mount(reader)
    assert reader_mount is not None and reader_mount.read_only

    # A publish with different read-only-ness on an existing target is refused.
    expect_code(grpc.StatusCode.ALREADY_EXISTS, volume.publish, staging, reader, cap)
    # Unstage while published is refused, and changes nothing.
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.unstage, staging)
    assert "still published" in message and writer in message
    assert top_mount(os.path.join(staging, "fs")) is not None

    volume.unpublish(writer)
    volume.unpublish(reader)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_single_node_single_writer_allows_one_writer(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    cap = mount_cap(mode=Mode.SINGLE_NODE_SINGLE_WRITER)
    staging, first, second = env.staging(), env.target(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, first, cap)
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.publish, staging, second, cap)
    volume.publish(staging, second, cap, readonly=True)  # a reader is fine
    volume.unpublish(first)
    volume.unpublish(second)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_mount_flags_reach_stage_and_publish(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    cap = mount_cap(flags=("noexec", "noatime"))
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    staged = top_mount(os.path.join(staging, "fs"))
    assert staged is not None and {"noexec", "noatime"} <= set(staged.options)
    volume.publish(staging, target, cap)
    published = top_mount(target)
    assert published is not None and {"noexec", "noatime"} <= set(published.options) and not published.read_only
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_read_only_access_mode(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    staging, target = env.staging(), env.target()
    # Format it first with a writable stage; a read-only volume is never formatted.
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.stage, staging, mount_cap(mode=Mode.SINGLE_NODE_READER_ONLY))
    assert_no_leftovers(env, volume)
    volume.stage(staging, mount_cap())
    volume.unstage(staging)
    cap = mount_cap(mode=Mode.SINGLE_NODE_READER_ONLY)
    volume.stage(staging, cap)
    assert top_mount(os.path.join(staging, "fs")).read_only  # type: ignore[union-attr]
    volume.publish(staging, target, cap)
    with pytest.raises(OSError) as caught:
        open(os.path.join(target, "x"), "w")
    assert caught.value.errno == errno.EROFS
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_repeated_calls_are_idempotent(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    cap = mount_cap()
    staging, target = env.staging(), env.target()
    for _ in range(10):
        volume.stage(staging, cap)
    for _ in range(10):
        volume.publish(staging, target, cap)
    assert len([m for m in read_mounts() if m.mount_point == target]) == 1
    assert len([m for m in read_mounts() if m.mount_point == os.path.join(staging, "fs")]) == 1
    for _ in range(10):
        volume.unpublish(target)
    for _ in range(10):
        volume.unstage(staging)
    assert_no_leftovers(env, volume)
    # Paths that are already gone are fine too.
    os.rmdir(staging)
    volume.unstage(staging)
    volume.unpublish(target)
    volume.unpublish(os.path.join(env.kubelet, "never", "existed"))


def test_conflicting_requests(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    first: Volume = make_volume()
    second: Volume = make_volume()
    staging, target = env.staging(), env.target()
    # Publishing a volume that is not staged.
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, first.publish, staging, target, mount_cap())
    assert "not staged" in message
    first.stage(staging, mount_cap())
    # Another volume on a staging path that holds this one.
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, second.stage, staging, mount_cap())
    assert first.volume_id in message
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, second.unstage, staging)
    # The same volume with another capability.
    expect_code(grpc.StatusCode.ALREADY_EXISTS, first.stage, staging, mount_cap("xfs"))
    expect_code(grpc.StatusCode.ALREADY_EXISTS, first.stage, staging, block_cap())
    # Publishing with the other access type.
    expect_code(grpc.StatusCode.FAILED_PRECONDITION, first.publish, staging, target, block_cap())
    # The target of another volume.
    first.publish(staging, target, mount_cap())
    second_staging = env.staging()
    second.stage(second_staging, mount_cap())
    expect_code(grpc.StatusCode.ALREADY_EXISTS, second.publish, second_staging, target, mount_cap())
    first.unpublish(target)
    first.unstage(staging)
    second.unstage(second_staging)
    assert_no_leftovers(env, first, second)


def test_parallel_stages_of_different_volumes(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    from concurrent.futures import ThreadPoolExecutor

    volumes = [make_volume() for _ in range(4)]
    stagings = [env.staging() for _ in volumes]
    with ThreadPoolExecutor(len(volumes)) as pool:
        list(pool.map(lambda pair: pair[0].stage(pair[1], mount_cap()), zip(volumes, stagings)))
    devices = {str(_record(s)["device"]) for s in stagings}
    assert len(devices) == len(volumes)
    with ThreadPoolExecutor(len(volumes)) as pool:
        list(pool.map(lambda pair: pair[0].unstage(pair[1]), zip(volumes, stagings)))
    assert_no_leftovers(env, *volumes)
