"""A volume staged and published by ceph-csi's node plugin, served by cephcsi after the switch
(docs/migrate-from-ceph-csi.md): the kubelet keeps ceph-csi's paths, so cephcsi must publish
from, re-stage and unpublish/unstage them. ceph-csi's layout (internal/rbd/nodeserver.go):
`<staging>/image-meta.json` (its stash) and the filesystem mounted at `<staging>/<volume id>`,
publishes bind-mounted from there. The volume has ceph-csi's id encoding and image naming
(`0001-<len>-<clusterID>-<pool id>-<uuid>`, `csi-vol-<uuid>`).

This node has no rbd/nbd kernel modules, so ceph-csi's krbd mapping is stood in for by the
device of a cephcsi fuse stage elsewhere; what is tested is the layout handling (mounts, stash,
refusals), and that the krbd unmap finds nothing mapped and succeeds."""
from __future__ import annotations

import json
import os
import subprocess
import uuid

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.node.mounts import top_mount
from cephcsi.volumes.volume_id import VolumeId
from tests.integration.node.conftest import NodeEnv, Volume, assert_no_leftovers, expect_code, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def ceph_csi_stage(volume: Volume, device: str, staging: str) -> str:
    """What ceph-csi's NodeStageVolume leaves for a krbd-mapped ext4 volume."""
    with open(os.path.join(staging, "image-meta.json"), "w") as handle:
        json.dump({"Version": 3, "pool": volume.context["pool"], "radosNamespace": "", "image": volume.image,
                   "unmapOptions": "", "accessType": False, "encrypted": False, "device": "",
                   "logDir": "", "logFileStrategy": ""}, handle)
    mount_point = os.path.join(staging, volume.volume_id)
    os.mkdir(mount_point, 0o750)
    subprocess.run(["mount", "-t", "ext4", "-o", "_netdev", device, mount_point], check=True)
    return mount_point


def test_volume_staged_by_ceph_csi_is_published_and_unstaged(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    object_uuid = str(uuid.uuid4())
    volume.volume_id = VolumeId(env.cluster.cluster_id, 1, object_uuid).encode()
    cap = mount_cap("ext4")
    # Stand-in for the krbd device: the loop device of a cephcsi stage at another path.
    helper = env.staging()
    volume.stage(helper, cap)
    with open(os.path.join(helper, "cephcsi-stage.json")) as handle:
        device = json.load(handle)["device"]
    # Only ceph-csi's mount may use the device (a second mount of it would count as a publish).
    subprocess.run(["umount", os.path.join(helper, "fs")], check=True)

    staging, old_target, new_target = env.staging(), env.target(), env.target()
    legacy_mount = ceph_csi_stage(volume, device, staging)
    os.mkdir(old_target)
    subprocess.run(["mount", "--bind", legacy_mount, old_target], check=True)  # ceph-csi's publish
    with open(os.path.join(old_target, "kept.txt"), "w") as handle:
        handle.write("written under ceph-csi")

    # After the switch: a kubelet restart re-stages (no second mount), a new pod publishes from it.
    volume.stage(staging, cap)
    assert not os.path.exists(os.path.join(staging, "fs")) and not os.path.exists(os.path.join(staging, "cephcsi-stage.json"))
    volume.publish(staging, new_target, cap)
    with open(os.path.join(new_target, "kept.txt")) as handle:
        assert handle.read() == "written under ceph-csi"
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.unstage, staging)
    assert "still published" in message
    assert top_mount(legacy_mount) is not None

    volume.unpublish(old_target)
    volume.unpublish(new_target)
    volume.unstage(staging)
    assert os.listdir(staging) == []  # ceph-csi's mount point and stash are gone
    volume.unstage(staging)  # idempotent
    volume.unstage(helper)
    assert_no_leftovers(env, volume)


def test_encrypted_ceph_csi_stage_is_refused(env: NodeEnv) -> None:
    volume_id = VolumeId(env.cluster.cluster_id, 1, str(uuid.uuid4())).encode()
    staging = env.staging()
    with open(os.path.join(staging, "image-meta.json"), "w") as handle:
        json.dump({"Version": 3, "pool": env.cluster.pool, "image": "csi-vol-x", "encrypted": True}, handle)
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, env.node.NodeUnstageVolume,
                          csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging))
    assert "LUKS" in message
