"""ReadOnlyMany filesystem volumes (MULTI_NODE_READER_ONLY + mount) on the real node: two
readers (two staging paths, each its own read-only mapping) see the data a writer left; the
filesystem is mounted `ro` without journal replay (ext4 `noload`, xfs `norecovery`: the kernel
shows both as `norecovery`), publishes are read-only, and a writer publish on a read-only stage
is refused. Fuse mapper against the real Ceph test cluster."""
from __future__ import annotations

import errno
import os

import grpc
import pytest

from cephcsi.node.mounts import top_mount
from tests.integration.node.conftest import Mode, NodeEnv, Volume, assert_no_leftovers, expect_code, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


@pytest.mark.parametrize("fs_type, size_mb", [("ext4", 64), ("xfs", 320)])
def test_two_readers_of_one_filesystem(env: NodeEnv, make_volume, fs_type: str, size_mb: int) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(size_mb)
    writer, reader = mount_cap(fs_type), mount_cap(fs_type, mode=Mode.MULTI_NODE_READER_ONLY)
    staging, target = env.staging(), env.target()
    volume.stage(staging, writer)
    volume.publish(staging, target, writer)
    with open(os.path.join(target, "shared.txt"), "w") as handle:
        handle.write("for every reader")
    volume.unpublish(target)
    volume.unstage(staging)

    readers = [(env.staging(), env.target()) for _ in range(2)]
    for staging, target in readers:
        volume.stage(staging, reader)
        staged = top_mount(os.path.join(staging, "fs"))
        assert staged is not None and staged.read_only
        assert "norecovery" in staged.super_options, staged.super_options  # no journal replay
        volume.publish(staging, target, reader)
    for staging, target in readers:
        with open(os.path.join(target, "shared.txt")) as handle:
            assert handle.read() == "for every reader"
        with pytest.raises(OSError) as caught:
            open(os.path.join(target, "new.txt"), "w").close()
        assert caught.value.errno == errno.EROFS
        published = top_mount(target)
        assert published is not None and published.read_only

    # A writer publish on a read-only stage is refused, whatever the pod asks.
    staging, _ = readers[0]
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.publish, staging, env.target(), writer)
    assert "staged read-only" in message
    # Staging a writer where a reader is staged is refused too (different capability).
    expect_code(grpc.StatusCode.ALREADY_EXISTS, volume.stage, staging, writer)

    for staging, target in readers:
        volume.unpublish(target)
        volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_reader_never_formats_an_empty_image(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    staging = env.staging()
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.stage, staging,
                          mount_cap("ext4", mode=Mode.MULTI_NODE_READER_ONLY))
    assert "never formatted" in message
    assert_no_leftovers(env, volume)
