"""Crash safety: the node plugin is killed with SIGKILL between (or in the middle of) stage
steps; mounted volumes must keep working, and unstage or a retried stage after the restart
must find and finish or undo everything."""
from __future__ import annotations

import json
import os
import subprocess
import time

import grpc
import pytest

from cephcsi.node.mounts import top_mount
from cephcsi.node.stage_record import RECORD_NAME
from tests.integration.node.conftest import (
    NodeEnv,
    Volume,
    assert_no_leftovers,
    block_cap,
    expect_code,
    fuse_daemons_under,
    loops_under,
    mount_cap,
    mounts_under,
)

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def _edit_record(staging: str, **changes: object) -> None:
    path = os.path.join(staging, RECORD_NAME)
    with open(path, encoding="utf-8") as handle:
        doc = json.load(handle)
    doc.update(changes)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle)


def test_kill_between_stage_and_unstage(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    cap = mount_cap()
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    with open(os.path.join(target, "before.txt"), "w") as handle:
        handle.write("written before the crash")
    before = sorted(mounts_under(env.root))

    env.driver.kill()
    # The volume stays usable while the plugin is down: rbd-fuse is its own daemon.
    assert sorted(mounts_under(env.root)) == before
    assert fuse_daemons_under(env.root)
    with open(os.path.join(target, "during.txt"), "w") as handle:
        handle.write("written while the plugin was down")
        handle.flush()
        os.fsync(handle.fileno())

    env.driver.start()
    assert sorted(mounts_under(env.root)) == before  # starting up touched nothing
    volume.stage(staging, cap)  # the kubelet may repeat it: still staged, nothing changes
    volume.publish(staging, target, cap)
    assert sorted(mounts_under(env.root)) == before
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)

    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    for name, text in (("before.txt", "written before the crash"), ("during.txt", "written while the plugin was down")):
        with open(os.path.join(target, name)) as handle:
            assert handle.read() == text
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


@pytest.mark.parametrize("lose_device", [False, True])
def test_crash_after_map_before_mount_then_unstage(env: NodeEnv, make_volume, lose_device: bool) -> None:  # type: ignore[no-untyped-def]
    """The state a crash leaves between `map` and `mount`: rbd-fuse and the loop device exist,
    nothing is mounted, the record says not staged (and, if the crash came right after the map,
    does not even know the device yet)."""
    volume: Volume = make_volume()
    staging = env.staging()
    volume.stage(staging, mount_cap())
    env.driver.kill()
    subprocess.run(["umount", os.path.join(staging, "fs")], check=True)
    _edit_record(staging, staged=False, **({"device": ""} if lose_device else {}))
    assert loops_under(env.root) and fuse_daemons_under(env.root)

    env.driver.start()
    volume.unstage(staging)
    assert os.listdir(staging) == []
    assert_no_leftovers(env, volume)


KEPT = "must survive the resumed stage"


def _killed_before_mount(env: NodeEnv, volume: Volume, staging: str, target: str, **record: object) -> None:
    """A volume staged once and written to, then the state a plugin killed between map and
    mount leaves (rbd-fuse and the loop device up, nothing mounted, the record saying `record`)."""
    volume.stage(staging, mount_cap())
    volume.publish(staging, target, mount_cap())
    with open(os.path.join(target, "keep.txt"), "w") as handle:
        handle.write(KEPT)
    volume.unpublish(target)
    env.driver.kill()
    subprocess.run(["umount", os.path.join(staging, "fs")], check=True)
    _edit_record(staging, staged=False, **record)
    env.driver.start()


def _restage_finds_the_data_and_unstage_leaves_nothing(env: NodeEnv, volume: Volume, staging: str,
                                                       target: str) -> None:
    volume.stage(staging, mount_cap())
    volume.publish(staging, target, mount_cap())
    with open(os.path.join(target, "keep.txt")) as handle:
        assert handle.read() == KEPT
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_crash_after_map_before_mount_then_stage_resumes(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    staging, target = env.staging(), env.target()
    _killed_before_mount(env, volume, staging, target, device="")
    volume.stage(staging, mount_cap())  # resumes: reuses rbd-fuse and the loop device, mounts, no mkfs
    assert len(loops_under(env.root)) == 1 and len(fuse_daemons_under(env.root)) == 1
    _restage_finds_the_data_and_unstage_leaves_nothing(env, volume, staging, target)


@pytest.mark.parametrize("record", [{"formatted": False, "mkfs_started": True}, {}], ids=["mkfs", "resize2fs"])
def test_resumed_stage_waits_for_an_interrupted_command_still_running(env: NodeEnv, make_volume,  # type: ignore[no-untyped-def]
                                                                      record: dict[str, object]) -> None:
    """A plugin killed during mkfs (or the offline resize2fs that grows a filesystem before its
    mount) leaves it running (hostPID: children outlive the plugin), and blkid finds nothing until
    mkfs writes its superblock last. While it runs, a resumed stage must neither probe-and-format
    nor mount, nor pull the mapping from under it: ABORTED, naming the holder. This process stands
    in for that command by claiming the device as both do (O_EXCL)."""
    volume: Volume = make_volume()
    staging, target = env.staging(), env.target()
    _killed_before_mount(env, volume, staging, target, **record)
    (device,) = loops_under(env.root)
    claim = os.open(device, os.O_RDONLY | os.O_EXCL)
    try:
        for _ in range(2):
            message = expect_code(grpc.StatusCode.ABORTED, volume.stage, staging, mount_cap())
            assert f"pid {os.getpid()} " in message and device in message
            assert loops_under(env.root) == [device] and len(fuse_daemons_under(env.root)) == 1  # left for the retry
    finally:
        os.close(claim)
    # The claim is gone: the filesystem is found and kept.
    _restage_finds_the_data_and_unstage_leaves_nothing(env, volume, staging, target)


def test_crash_mid_map_before_loop_attach(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    """rbd-fuse started, the loop device not yet attached: unstage stops rbd-fuse."""
    volume: Volume = make_volume()
    staging = env.staging()
    volume.stage(staging, block_cap())
    env.driver.kill()
    subprocess.run(["umount", os.path.join(staging, "block")], check=True)
    for device in loops_under(env.root):
        subprocess.run(["losetup", "-d", device], check=True)
    _edit_record(staging, staged=False, device="")
    env.driver.start()
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


@pytest.mark.parametrize("cap", [mount_cap(), block_cap()], ids=["filesystem", "block"])
def test_unstage_without_record_rederives_from_the_system(env: NodeEnv, make_volume, cap) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume()
    staging = env.staging()
    volume.stage(staging, cap)
    os.unlink(os.path.join(staging, RECORD_NAME))
    volume.unstage(staging)
    assert top_mount(os.path.join(staging, "fs")) is None
    assert_no_leftovers(env, volume)


def test_rbd_fuse_death_is_reported_and_cleaned_up(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    """In a container, rbd-fuse dies with the container: the volume turns abnormal, and unstage
    still releases the loop device and the dead FUSE mount."""
    from cephcsi._generated import csi_pb2

    volume: Volume = make_volume()
    staging, target = env.staging(), env.target()
    volume.stage(staging, mount_cap())
    volume.publish(staging, target, mount_cap())
    request = csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=target)
    assert not env.node.NodeGetVolumeStats(request).volume_condition.abnormal
    for pid in fuse_daemons_under(env.root):
        os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while fuse_daemons_under(env.root) and time.monotonic() < deadline:
        time.sleep(0.05)
    condition = env.node.NodeGetVolumeStats(request).volume_condition
    assert condition.abnormal and "rbd-fuse" in condition.message
    volume.unpublish(target)
    volume.unstage(staging)
    assert mounts_under(env.root) == [] and loops_under(env.root) == []
    assert fuse_daemons_under(env.root) == []
