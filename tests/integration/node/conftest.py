"""Fixtures for node-plugin tests against the real Ceph test cluster and a real cephcsi process.

Everything a test creates lives under one short /tmp directory (kubelet/ for staging and target
paths, state/ for the driver's --state-dir). Cleanup runs even when a test fails, in the only
safe order: unmount filesystems and binds (deepest first), detach loop devices backed by files
under the directory, unmount rbd-fuse mounts, stop stray rbd-fuse daemons — and only then
delete files. A recursive delete while an rbd-fuse mount is live would unlink the image file,
which deletes the RBD image itself, so `remove_tree` refuses while anything is still mounted.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.node.mappers.loops import attached_loops
from cephcsi.node.mounts import read_mounts
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess

Cap = csi_pb2.VolumeCapability
Mode = Cap.AccessMode


# -- leak inspection ---------------------------------------------------------------------------


def mounts_under(root: str) -> list[str]:
    prefix = os.path.realpath(root).rstrip("/") + "/"
    return [e.mount_point for e in read_mounts() if e.mount_point.startswith(prefix)]


def loops_under(root: str) -> list[str]:
    prefix = os.path.realpath(root).rstrip("/") + "/"
    return [device for device, backing in attached_loops() if backing.startswith(prefix)]


def fuse_daemons_under(root: str) -> list[int]:
    """Live rbd-fuse processes whose argv names a path under root."""
    found = []
    marker = os.fsencode(os.path.realpath(root))
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == b"rbd-fuse" and any(a.startswith(marker) for a in argv):
            found.append(int(entry))
    return found


def losetup_listing() -> str:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout


def release_everything(root: str) -> None:
    """Undo whatever a test or the driver left mounted or attached under root."""
    for _ in range(5):
        fs_mounts = [m for m in mounts_under(root) if "/fuse/" not in m]
        for mount_point in sorted(fs_mounts, key=len, reverse=True):
            if subprocess.run(["umount", mount_point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
        for device in loops_under(root):
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
        for mount_point in sorted(mounts_under(root), key=len, reverse=True):
            if subprocess.run(["umount", mount_point], capture_output=True, check=False).returncode != 0:
                subprocess.run(["umount", "-l", mount_point], capture_output=True, check=False)
        if not mounts_under(root) and not loops_under(root):
            break
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while fuse_daemons_under(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in fuse_daemons_under(root):
        os.kill(pid, signal.SIGKILL)


def remove_tree(root: str) -> None:
    if mounts_under(root):
        raise AssertionError(f"refusing to delete {root}: still mounted: {mounts_under(root)}")
    shutil.rmtree(root, ignore_errors=True)


# -- the node under test -----------------------------------------------------------------------


@dataclass
class NodeEnv:
    root: str
    cluster: CephTestCluster
    driver: DriverProcess
    kubelet: str
    state: str
    counter: int = 0

    def staging(self) -> str:
        self.counter += 1
        path = os.path.join(self.kubelet, "st", str(self.counter))
        os.makedirs(path)
        return path

    def target(self) -> str:
        self.counter += 1
        parent = os.path.join(self.kubelet, "pods", str(self.counter))
        os.makedirs(parent)
        return os.path.join(parent, "mount")

    @property
    def node(self):  # type: ignore[no-untyped-def]
        return self.driver.node


@dataclass
class Volume:
    volume_id: str
    image: str
    context: dict[str, str]
    size: int
    env: NodeEnv = field(repr=False)

    def stage_request(self, staging: str, cap: Cap, **extra: object) -> csi_pb2.NodeStageVolumeRequest:
        return csi_pb2.NodeStageVolumeRequest(
            volume_id=self.volume_id, staging_target_path=staging, volume_capability=cap,
            secrets=self.env.cluster.secrets, volume_context=self.context, **extra,  # type: ignore[arg-type]
        )

    def stage(self, staging: str, cap: Cap) -> None:
        self.env.node.NodeStageVolume(self.stage_request(staging, cap), timeout=120)

    def unstage(self, staging: str) -> None:
        self.env.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=self.volume_id, staging_target_path=staging), timeout=120
        )

    def publish(self, staging: str, target: str, cap: Cap, readonly: bool = False) -> None:
        self.env.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=self.volume_id, staging_target_path=staging, target_path=target,
                volume_capability=cap, readonly=readonly,
            ),
            timeout=60,
        )

    def unpublish(self, target: str) -> None:
        self.env.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=self.volume_id, target_path=target), timeout=60
        )

    def watchers(self) -> list[dict[str, object]]:
        out = self.env.cluster.admin("rbd", "status", "--format", "json", f"{self.env.cluster.pool}/{self.image}")
        return list(json.loads(out).get("watchers", []))


def mount_cap(fs_type: str = "ext4", mode: Mode.Mode = Mode.SINGLE_NODE_WRITER, flags: tuple[str, ...] = ()) -> Cap:
    return Cap(mount=Cap.MountVolume(fs_type=fs_type, mount_flags=list(flags)), access_mode=Mode(mode=mode))


def block_cap(mode: Mode.Mode = Mode.SINGLE_NODE_WRITER) -> Cap:
    return Cap(block=Cap.BlockVolume(), access_mode=Mode(mode=mode))


def assert_no_leftovers(env: NodeEnv, *volumes: Volume) -> None:
    assert mounts_under(env.root) == [], f"mounts left: {mounts_under(env.root)}"
    assert loops_under(env.root) == [], f"loop devices left:\n{losetup_listing()}"
    assert fuse_daemons_under(env.root) == [], "rbd-fuse processes left"
    for volume in volumes:
        assert volume.watchers() == [], f"watchers left on {volume.image}"
    fuse_dir = os.path.join(env.state, "fuse")
    assert not os.path.isdir(fuse_dir) or os.listdir(fuse_dir) == [], f"fuse work dirs left: {os.listdir(fuse_dir)}"


def expect_code(code: grpc.StatusCode, call: Callable[..., object], *args: object, **kwargs: object) -> str:
    """Run a gRPC call that must fail with `code`; returns the status message."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    error = caught.value
    assert error.code() == code, f"expected {code.name}, got {error.code().name}: {error.details()}"
    return str(error.details())


@contextlib.contextmanager
def running_node_env(ceph_cluster: CephTestCluster, node_id: str = "test-node", prefix: str = "nd-",
                     extra_args: tuple[str, ...] = ()) -> Iterator[NodeEnv]:
    """A node plugin under a fresh short /tmp folder, stopped and everything it left released
    and removed afterwards."""
    root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    kubelet = os.path.join(root, "kubelet")
    state = os.path.join(root, "state")
    os.makedirs(kubelet)
    config = ceph_cluster.write_config(os.path.join(root, "config.json"))
    driver = DriverProcess(
        config, mode="node",
        # A short mount timeout keeps the wrong-key test quick; rbd-fuse connects in ~50 ms here.
        args=[f"--nodeid={node_id}", f"--kubelet-dir={kubelet}", f"--state-dir={state}", "--client-mount-timeout=4s",
              *extra_args],
        workdir=os.path.join(root, "drv"),
    )
    os.makedirs(driver.workdir, exist_ok=True)
    env = NodeEnv(root, ceph_cluster, driver, kubelet, state)
    try:
        driver.start()
        yield env
    finally:
        driver.stop()
        release_everything(root)
        if os.environ.get("KEEP_NODE_LOGS"):
            print(driver.log())
        remove_tree(root)


@pytest.fixture(scope="module")
def node_env(ceph_cluster: CephTestCluster) -> Iterator[NodeEnv]:
    with running_node_env(ceph_cluster) as env:
        yield env


@pytest.fixture
def env(node_env: NodeEnv) -> Iterator[NodeEnv]:
    """Per test: the same driver, and a clean node afterwards whatever the test did."""
    if node_env.driver.process is None or node_env.driver.process.poll() is not None:
        node_env.driver.start()
    yield node_env
    release_everything(node_env.root)
    for path in (os.path.join(node_env.kubelet, "st"), os.path.join(node_env.kubelet, "pods"), os.path.join(node_env.state, "fuse")):
        remove_tree(path)


@pytest.fixture
def make_volume(env: NodeEnv) -> Iterator[Callable[..., Volume]]:
    created: list[Volume] = []

    def make(size_mb: int = 64) -> Volume:
        image = f"nt-{uuid.uuid4().hex[:10]}"
        env.cluster.admin("rbd", "create", "--size", f"{size_mb}M", f"{env.cluster.pool}/{image}")
        volume_id = VolumeId(env.cluster.cluster_id, 1, VolumeId.new_uuid()).encode()
        context = {"clusterID": env.cluster.cluster_id, "pool": env.cluster.pool, "imageName": image}
        volume = Volume(volume_id, image, context, size_mb << 20, env)
        created.append(volume)
        return volume

    yield make
    release_everything(env.root)
    for volume in created:
        remove_image(env.cluster, volume)


def remove_image(cluster: CephTestCluster, volume: Volume) -> None:
    """rbd rm; a watch left by a SIGKILLed rbd-fuse would block it for ~30 s until it expires,
    so such watchers (their daemons are gone: release_everything ran) are blocklisted first."""
    for _ in range(3):
        try:
            for watcher in volume.watchers():
                cluster.admin("ceph", "osd", "blocklist", "add", str(watcher["address"]))
            cluster.admin("rbd", "rm", "--no-progress", f"{cluster.pool}/{volume.image}")
            return
        except subprocess.CalledProcessError as error:
            if "No such file" in (error.stderr or ""):
                return
            time.sleep(0.5)
    raise AssertionError(f"could not remove test image {volume.image}")
