"""Static (pre-provisioned) volumes on the real node: the volume handle is the bare RBD image
name and volumeAttributes carry staticVolume "true", clusterID and pool, as in ceph-csi's
docs/static-pvc.md. Stage, publish, stats, unpublish and unstage through a real
`cephcsi --mode=node` process with the fuse mapper against the real Ceph test cluster."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.integration.node.conftest import (
    NodeEnv,
    Volume,
    assert_no_leftovers,
    block_cap,
    expect_code,
    mount_cap,
    release_everything,
    remove_image,
)

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


class StaticVolume(Volume):
    def publish(self, staging: str, target: str, cap: csi_pb2.VolumeCapability, readonly: bool = False) -> None:
        # The kubelet passes the PV's volumeAttributes to NodePublishVolume too.
        self.env.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=self.volume_id, staging_target_path=staging, target_path=target,
                volume_capability=cap, readonly=readonly, volume_context=self.context,
            ),
            timeout=60,
        )


@pytest.fixture
def static_volume(env: NodeEnv) -> Iterator[Volume]:
    image = f"static-{uuid.uuid4().hex[:8]}"
    env.cluster.admin("rbd", "create", "--size", "64M", f"{env.cluster.pool}/{image}")
    context = {"staticVolume": "true", "clusterID": env.cluster.cluster_id, "pool": env.cluster.pool,
               "imageFeatures": "layering"}
    volume = StaticVolume(image, image, context, 64 << 20, env)
    yield volume
    release_everything(env.root)
    remove_image(env.cluster, volume)


def test_static_filesystem_volume_full_cycle(env: NodeEnv, static_volume: Volume) -> None:
    volume, cap = static_volume, mount_cap("ext4")
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.stage(staging, cap)  # idempotent
    volume.publish(staging, target, cap)
    with open(os.path.join(target, "hello"), "w") as handle:
        handle.write("static")
    stats = env.node.NodeGetVolumeStats(csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=target))
    assert stats.usage[0].unit == csi_pb2.VolumeUsage.Unit.BYTES and 0 < stats.usage[0].total <= volume.size
    assert not stats.volume_condition.abnormal
    staged_stats = env.node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=volume.volume_id, volume_path=staging))
    assert staged_stats.usage[0].total == stats.usage[0].total
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)
    # The data is in the image, found again by the next stage (no reformat).
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    with open(os.path.join(target, "hello")) as handle:
        assert handle.read() == "static"
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_static_block_volume(env: NodeEnv, static_volume: Volume) -> None:
    volume, cap = static_volume, block_cap()
    staging, target = env.staging(), env.target()
    volume.stage(staging, cap)
    volume.publish(staging, target, cap)
    fd = os.open(target, os.O_RDONLY)
    try:
        assert os.lseek(fd, 0, os.SEEK_END) == volume.size
    finally:
        os.close(fd)
    volume.unpublish(target)
    volume.unstage(staging)
    assert_no_leftovers(env, volume)


def test_static_volume_refusals(env: NodeEnv, static_volume: Volume) -> None:
    volume = static_volume
    staging = env.staging()
    without_flag = {k: v for k, v in volume.context.items() if k != "staticVolume"}
    message = expect_code(grpc.StatusCode.NOT_FOUND, env.node.NodeStageVolume,
                          csi_pb2.NodeStageVolumeRequest(volume_id=volume.volume_id, staging_target_path=staging,
                                                         volume_capability=mount_cap(), secrets=env.cluster.secrets,
                                                         volume_context=without_flag))
    assert "staticVolume" in message
    missing = Volume(f"missing-{uuid.uuid4().hex[:6]}", "", volume.context, 0, env)
    expect_code(grpc.StatusCode.NOT_FOUND, missing.stage, staging, mount_cap())
    assert_no_leftovers(env)
