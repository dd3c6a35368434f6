"""Issue 11 (data safety) on real Ceph with real node plugins and the rbd-fuse mapper:

* a stage interrupted right after mkfs is resumed on its node after another node has staged
  the volume and written to it: the data survives (no mkfs, no force flag);
* after a node plugin restart without a drain, the loop device whose rbd-fuse mount died with
  the old mount namespace is still released by unstage.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from cephcsi.node.mappers.loops import attached_loops
from cephcsi.node.stage_record import RECORD_NAME
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import (
    NodeEnv,
    Volume,
    assert_no_leftovers,
    expect_code,
    fuse_daemons_under,
    loops_under,
    mount_cap,
    mounts_under,
    release_everything,
    remove_image,
    remove_tree,
)

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

AFTER_MKFS = "node.after-mkfs"


def _record(staging: str) -> dict[str, object]:
    with open(os.path.join(staging, RECORD_NAME), encoding="utf-8") as handle:
        doc: dict[str, object] = json.load(handle)
    return doc


def _fs_uuid(device: str) -> str:
    out = subprocess.run(["blkid", "-p", "-o", "value", "-s", "UUID", device], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def _backing_file(device: str) -> str | None:
    try:
        with open(f"/sys/block/{os.path.basename(device)}/loop/backing_file", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _node(root: str, cluster: CephTestCluster, config: str, name: str) -> NodeEnv:
    home = os.path.join(root, name)
    kubelet, state = os.path.join(home, "kubelet"), os.path.join(home, "state")
    os.makedirs(kubelet)
    driver = DriverProcess(
        config, mode="node",
        args=[f"--nodeid=node-{name}", f"--kubelet-dir={kubelet}", f"--state-dir={state}", "--client-mount-timeout=4s"],
        workdir=os.path.join(home, "drv"),
    )
    os.makedirs(driver.workdir)
    return NodeEnv(home, cluster, driver, kubelet, state)


@dataclass
class TwoNodes:
    a: NodeEnv
    b: NodeEnv
    volume_id: str
    image: str

    def volume(self, node: NodeEnv) -> Volume:
        context = {"clusterID": node.cluster.cluster_id, "pool": node.cluster.pool, "imageName": self.image}
        return Volume(self.volume_id, self.image, context, 64 << 20, node)


@pytest.fixture
def two_nodes(ceph_cluster: CephTestCluster) -> Iterator[TwoNodes]:
    """Two node plugins (own node id, kubelet dir, state dir) and one 64 MiB image."""
    root = tempfile.mkdtemp(prefix="ds-", dir="/tmp")
    config = ceph_cluster.write_config(os.path.join(root, "config.json"))
    a, b = _node(root, ceph_cluster, config, "a"), _node(root, ceph_cluster, config, "b")
    image = f"ds-{uuid.uuid4().hex[:10]}"
    ceph_cluster.admin("rbd", "create", "--size", "64M", f"{ceph_cluster.pool}/{image}")
    nodes = TwoNodes(a, b, VolumeId(ceph_cluster.cluster_id, 1, VolumeId.new_uuid()).encode(), image)
    try:
        yield nodes
    finally:
        for node in (a, b):
            node.driver.stop()
            if os.environ.get("KEEP_NODE_LOGS"):
                print(node.driver.log())
        release_everything(root)
        remove_image(ceph_cluster, nodes.volume(a))
        remove_tree(root)


def _simulate_power_loss(node: NodeEnv) -> None:
    """What a node that lost power no longer has: its rbd-fuse daemons, loop devices and
    mounts. Its disk (the staging directory with the stage record) stays as it was."""
    release_everything(node.root)
    assert mounts_under(node.root) == [] and loops_under(node.root) == [] and fuse_daemons_under(node.root) == []


def test_stage_interrupted_after_mkfs_never_reformats_data_written_elsewhere(two_nodes: TwoNodes) -> None:
    """Issue 11, scenario 1. Before the fix, node A's resumed stage ran `mkfs.ext4 -F` over the
    filesystem node B had filled, and B's file was gone."""
    node_a, node_b = two_nodes.a, two_nodes.b
    cap = mount_cap("ext4")
    # 1. Node A formats the new volume and dies before its stage completes.
    node_a.driver.env = {"CEPHCSI_FAILPOINTS": AFTER_MKFS}
    node_a.driver.start()
    staging_a = node_a.staging()
    on_a = two_nodes.volume(node_a)
    with pytest.raises(grpc.RpcError):
        on_a.stage(staging_a, cap)
    assert node_a.driver.process is not None
    assert node_a.driver.process.wait(timeout=30) == -signal.SIGKILL
    record = _record(staging_a)
    assert record["mkfs_started"] is True and record["formatted"] is False and record["staged"] is False
    made_by_a = _fs_uuid(str(record["device"]))
    assert made_by_a and made_by_a == record["mkfs_uuid"], "mkfs completed with the UUID recorded beforehand"
    _simulate_power_loss(node_a)

    # 2. The pod moves to node B: B stages the volume, keeps A's filesystem, the workload writes.
    node_b.driver.start()
    on_b = two_nodes.volume(node_b)
    staging_b, target_b = node_b.staging(), node_b.target()
    on_b.stage(staging_b, cap)
    on_b.publish(staging_b, target_b, cap)
    with open(os.path.join(target_b, "data.txt"), "w", encoding="utf-8") as handle:
        handle.write("written on node B")
        handle.flush()
        os.fsync(handle.fileno())
    on_b.unpublish(target_b)
    on_b.unstage(staging_b)
    assert "filesystem created" not in node_b.driver.log()

    # 3. The volume comes back to node A, at A's old staging path with the old record.
    node_a.driver.env = {}
    node_a.driver.start()
    log_before = len(node_a.driver.log())
    target_a = node_a.target()
    on_a.stage(staging_a, cap)
    on_a.publish(staging_a, target_a, cap)
    with open(os.path.join(target_a, "data.txt"), encoding="utf-8") as handle:
        assert handle.read() == "written on node B"
    restarted_log = node_a.driver.log()[log_before:]
    assert "filesystem created" not in restarted_log and "mkfs." not in restarted_log
    assert "keeping it, not formatting" in restarted_log
    device = str(_record(staging_a)["device"])
    assert _fs_uuid(device) == made_by_a
    on_a.unpublish(target_a)
    on_a.unstage(staging_a)
    for node in (node_a, node_b):
        assert_no_leftovers(node)


def _orphan_the_fuse_mount(env: NodeEnv, staging: str) -> str:
    """The state a node plugin container restart without a drain leaves: the plugin and its
    rbd-fuse are dead, the rbd-fuse mount is gone with the container's mount namespace (a lazy
    unmount shows the kernel's view of that), the loop device and the staging mount remain."""
    record = _record(staging)
    device, image, work_dir = str(record["device"]), str(record["image"]), str(record["work_dir"])
    env.driver.kill()
    for pid in fuse_daemons_under(env.root):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["umount", "-l", os.path.join(work_dir, "mnt")], check=True)
    assert _backing_file(device) == f"/{image}"
    assert loops_under(env.root) == []  # what the search by path under the work dir sees
    env.driver.start()
    return device


def _detach_if_left(device: str, image: str) -> None:
    """Test hygiene: the leak under test would otherwise outlive the test."""
    if _backing_file(device) == f"/{image}":
        subprocess.run(["umount", "-l", device], capture_output=True, check=False)
        subprocess.run(["losetup", "-d", device], capture_output=True, check=False)


@pytest.mark.parametrize("restage_first", [False, True], ids=["unstage", "restage-then-unstage"])
def test_loop_device_released_after_plugin_restart_without_drain(env: NodeEnv, make_volume, restage_first: bool) -> None:  # type: ignore[no-untyped-def]
    """Issue 11: before the fix, NodeUnstage returned OK and the loop device stayed attached
    forever, its backing file reading `/<image>`."""
    volume: Volume = make_volume()
    staging = env.staging()
    volume.stage(staging, mount_cap())
    record = _record(staging)
    assert isinstance(record.get("loop"), dict) and record["loop"]["device"] == record["device"]  # type: ignore[index]
    device = _orphan_the_fuse_mount(env, staging)
    try:
        if restage_first:
            # Still mounted from the dead loop: staging again must not map a second loop device
            # (and lose track of the first); it tells the operator what to do instead.
            message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.stage, staging, mount_cap())
            assert "rbd-fuse mount is gone" in message and device in message
            assert [d for d, backing in attached_loops() if backing.endswith(f"/{volume.image}")] == [device]
        volume.unstage(staging)
        assert _backing_file(device) is None, f"loop device {device} still attached after unstage"
        assert os.listdir(staging) == []
        assert_no_leftovers(env)
    finally:
        _detach_if_left(device, volume.image)
