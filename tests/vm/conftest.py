"""Session fixtures of the real-kernel tier: one VM node (stock Debian kernel: krbd, rbd-nbd),
a Ceph test cluster bound to the host's bridge address, and the node plugin in the VM.

One boot per test session (25-140 s under TCG, depending on the host's load): every test shares
the VM, cleans what it staged, and checks that nothing stays mapped. The fixtures are
package-scoped, so the VM and its cluster (~2.5 GB of RAM, and an emulated CPU that is never quite
idle) are gone once tests/vm is done, before the e2e tests that run last. The tier skips, saying why,
where it cannot run: no qemu, not root, no /dev/net/tun, or no image built (scripts/setup.sh
builds it, tests/vm/build_image.sh).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster, running_cluster
from tests.vm import network
from tests.vm.machine import QEMU, IndexInUse, VmImage, VmNode
from tests.vm.plugin import KUBELET_DIR, GuestPlugin

REPO = str(pathlib.Path(__file__).resolve().parents[2])
BUILD = pathlib.Path(__file__).with_name("build_image.sh")
MiB = 1 << 20
STAGING_ROOT = f"{KUBELET_DIR}/plugins/kubernetes.io/csi/rbd.csi.ceph.com"
PODS_ROOT = f"{KUBELET_DIR}/pods"
MAX_CONCURRENT_SESSIONS = 4
Cap = csi_pb2.VolumeCapability
Mode = Cap.AccessMode


def missing_requirement() -> str:
    """Why this machine cannot run the VM tier ('' when it can)."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not installed (scripts/setup.sh installs qemu-system-x86)"
    if os.geteuid() != 0:
        return "the VM tier needs root (tap devices, a bridge, 9p shares with passthrough)"
    if not os.path.exists("/dev/net/tun"):
        return "/dev/net/tun is missing: no tap device for the VM"
    if shutil.which("ceph-mon") is None:
        return "ceph-mon is not installed (the VM tier starts its own Ceph test cluster)"
    return ""


def built_image() -> VmImage | None:
    result = subprocess.run([str(BUILD), "--check"], capture_output=True, text=True, check=False, timeout=60)
    if result.returncode != 0:
        return None
    image = VmImage(result.stdout.strip().splitlines()[-1])
    return image if image.complete() else None


def image_or_skip(who: str) -> VmImage:
    """The VM image, or a visible skip of the calling test saying why it cannot run here."""
    reason = missing_requirement()
    if reason:
        pytest.skip(f"{who}: {reason}")
    image = built_image()
    if image is None:
        pytest.skip(f"{who}: the VM image is not built for the current tests/vm (run scripts/setup.sh, "
                    "or tests/vm/build_image.sh)")
    return image


@pytest.fixture(scope="package")
def vm_image() -> VmImage:
    return image_or_skip("VM tier")


@pytest.fixture(scope="package")
def vm_cluster(vm_image: VmImage) -> Iterator[CephTestCluster]:
    """A Ceph cluster the VM can reach: bound to the bridge address (the bridge must exist first)."""
    network.ensure_bridge()
    try:
        with running_cluster("cv-", address=network.HOST_ADDRESS) as cluster:
            yield cluster
    finally:
        network.remove_bridge()  # after the cluster bound to its address, and the VMs' taps, are gone


def boot_free_node(image: VmImage, workdir: str, indexes: Iterable[int], memory_mb: int = 2048,
                   disks: tuple[str, ...] = ()) -> VmNode | None:
    """A node booted at the first of `indexes` no other VM on this machine holds (each index has
    its own tap and address, so concurrent test sessions do not collide); None if all are held."""
    for index in indexes:
        node = VmNode(image, index, workdir, REPO, memory_mb=memory_mb, disks=disks)
        try:
            node.start()
        except IndexInUse:
            continue
        return node
    return None


@contextlib.contextmanager
def second_node(image: VmImage, cluster: CephTestCluster, first: VmNode) -> Iterator[VmEnv]:
    """Another VM node with its own node plugin, for a module that needs two nodes (one more boot,
    25-140 s under TCG); skips when every index is held. Stopped afterwards, also when a test
    killed it already."""
    workdir = tempfile.mkdtemp(prefix="vm2-", dir="/tmp")
    node = None
    try:
        others = (index for index in range(2 * MAX_CONCURRENT_SESSIONS) if index != first.index)
        node = boot_free_node(image, workdir, others)
        if node is None:
            pytest.skip("VM tier: no free VM node index for a second node on this machine")
        print(f"\nsecond VM node {node.index} ({node.accel}) ready after {node.boot_seconds:.0f}s")
        guest = GuestPlugin(node, cluster)
        guest.start()
        yield VmEnv(node, guest, cluster)
    finally:
        if node is not None:
            if os.environ.get("KEEP_VM_LOGS"):
                print(node.diagnostics(400), node.read_file("plugin.log"))
            node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


class SharedSecondNode:
    """The second VM node of the modules that need two (tests/vm/test_concurrent_format.py,
    test_fencing.py): booted once for all of them (a boot is 25-140 s under TCG), not once per
    module. A module gets it with `env()`; each leaves it with nothing mapped or mounted. A node
    that is gone (test_fencing.py's last test powers it off, which is why pytest_collection_modifyitems
    runs the sharers last, in file order) or that a failed module left dirty is booted again."""

    def __init__(self, image: VmImage, cluster: CephTestCluster, first: VmNode) -> None:
        self.image, self.cluster, self.first = image, cluster, first
        self.boots = 0
        self._manager: contextlib.AbstractContextManager[VmEnv] | None = None
        self._env: VmEnv | None = None

    def env(self) -> VmEnv:
        if self._env is not None and self._env.vm.running():
            leftovers = self._leftovers(self._env)
            if not leftovers:
                return self._env
            print(f"\nsecond VM node left dirty by an earlier module ({leftovers}): booted again")
        self.close()
        manager = second_node(self.image, self.cluster, self.first)
        self._env = manager.__enter__()
        self._manager = manager
        self.boots += 1
        return self._env

    @staticmethod
    def _leftovers(env: VmEnv) -> str:
        mapped = env.mapped("krbd") + env.mapped("nbd")
        mounts = env.vm.check(f"awk '$2 ~ \"^{KUBELET_DIR}/\" {{print $2}}' /proc/mounts", timeout=30).strip()
        return "; ".join(part for part in (mapped, mounts) if part)

    def close(self) -> None:
        manager, self._manager, self._env = self._manager, None, None
        if manager is not None:
            manager.__exit__(None, None, None)


@pytest.fixture(scope="package")
def shared_second_node(vm_image: VmImage, vm_cluster: CephTestCluster, vm_node: VmNode) -> Iterator[SharedSecondNode]:
    shared = SharedSecondNode(vm_image, vm_cluster, vm_node)
    try:
        yield shared
    finally:
        shared.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tier's tests that share the second VM node last in the tier (in file order, so
    test_fencing.py, which powers that node off, comes after test_concurrent_format.py): it is
    then booted once, and no idle emulated CPU slows the one-node modules down meanwhile."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    places = [i for i, item in enumerate(items) if str(item.path).startswith(here)]
    ours = [items[i] for i in places]
    ordered = sorted(ours, key=lambda item: "shared_second_node" in getattr(item, "fixturenames", ()))
    for i, item in zip(places, ordered):
        items[i] = item


@pytest.fixture(scope="package")
def vm_node(vm_image: VmImage, vm_cluster: CephTestCluster) -> Iterator[VmNode]:
    workdir = tempfile.mkdtemp(prefix="vm-", dir="/tmp")
    node = None
    try:
        node = boot_free_node(vm_image, workdir, range(MAX_CONCURRENT_SESSIONS))
        if node is None:
            pytest.skip(f"VM tier: {MAX_CONCURRENT_SESSIONS} other test sessions run VM nodes on this machine")
        print(f"\nVM node {node.index} ({node.accel}) ready after {node.boot_seconds:.0f}s")
        yield node
    finally:
        if node is not None:
            node.stop()
            if os.environ.get("KEEP_VM_LOGS"):
                print(node.diagnostics(400))
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="package")
def plugin(vm_node: VmNode, vm_cluster: CephTestCluster) -> Iterator[GuestPlugin]:
    guest = GuestPlugin(vm_node, vm_cluster)
    guest.start()
    try:
        yield guest
    finally:
        if os.environ.get("KEEP_VM_LOGS"):
            print(guest.log())
        if vm_node.running():
            guest.stop()


# -- volumes ------------------------------------------------------------------------------------


@dataclass
class VmVolume:
    """An RBD image and the CSI calls on it, made to the plugin in the VM."""

    volume_id: str
    image: str
    context: dict[str, str]
    plugin: GuestPlugin = field(repr=False)
    cluster: CephTestCluster = field(repr=False)

    def stage(self, staging: str, cap: Cap, timeout: float = 240) -> None:
        self.plugin.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
            volume_id=self.volume_id, staging_target_path=staging, volume_capability=cap,
            secrets=self.cluster.secrets, volume_context=self.context), timeout=timeout)

    def unstage(self, staging: str, timeout: float = 240) -> None:
        self.plugin.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
            volume_id=self.volume_id, staging_target_path=staging), timeout=timeout)

    def publish(self, staging: str, target: str, cap: Cap, timeout: float = 120) -> None:
        self.plugin.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=self.volume_id, staging_target_path=staging, target_path=target,
            volume_capability=cap), timeout=timeout)

    def unpublish(self, target: str, timeout: float = 120) -> None:
        self.plugin.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=self.volume_id, target_path=target), timeout=timeout)

    def expand(self, path: str, size_mb: int, staging: str = "", timeout: float = 240) -> int:
        request = csi_pb2.NodeExpandVolumeRequest(
            volume_id=self.volume_id, volume_path=path, staging_target_path=staging,
            capacity_range=csi_pb2.CapacityRange(required_bytes=size_mb * MiB))
        return int(self.plugin.node.NodeExpandVolume(request, timeout=timeout).capacity_bytes)

    def grow(self, size_mb: int) -> None:
        """What ControllerExpandVolume does to the image (the plugin in the VM sees it through Ceph)."""
        self.cluster.admin("rbd", "resize", "--no-progress", "--size", f"{size_mb}M", f"{self.cluster.pool}/{self.image}")


_PATHS = itertools.count(1)  # unique for the session: a failed test's leftovers never collide


@dataclass
class VmEnv:
    vm: VmNode
    plugin: GuestPlugin
    cluster: CephTestCluster

    def staging(self) -> str:
        return f"{STAGING_ROOT}/st{next(_PATHS)}/globalmount"

    def target(self) -> str:
        parent = f"{PODS_ROOT}/p{next(_PATHS)}/volumes/kubernetes.io~csi/pvc"
        self.vm.check(f"mkdir -p {parent}")
        return f"{parent}/mount"

    def mapped(self, device_type: str) -> str:
        """`rbd device list` for krbd or nbd in the VM (stdout; '' when nothing is mapped)."""
        return self.vm.check(f"rbd device list --device-type {device_type} 2>/dev/null", timeout=60).strip()


def mount_cap(fs_type: str = "ext4") -> Cap:
    return Cap(mount=Cap.MountVolume(fs_type=fs_type), access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))


def block_cap() -> Cap:
    return Cap(block=Cap.BlockVolume(), access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))


@pytest.fixture
def vm_env(vm_node: VmNode, plugin: GuestPlugin, vm_cluster: CephTestCluster) -> Iterator[VmEnv]:
    env = VmEnv(vm_node, plugin, vm_cluster)
    yield env
    # Whatever a failed test left: nothing mapped or mounted may leak into the next test.
    vm_node.run(
        f"for m in $(awk '$2 ~ \"^{KUBELET_DIR}/\" {{print $2}}' /proc/mounts | sort -r); do umount $m; done; "
        "for d in $(rbd device list -t krbd --format json 2>/dev/null | python3 -c "
        "'import json,sys; [print(e[\"device\"]) for e in json.load(sys.stdin)]'); do rbd device unmap $d; done; "
        "for d in $(rbd device list -t nbd --format json 2>/dev/null | python3 -c "
        "'import json,sys; [print(e[\"device\"]) for e in json.load(sys.stdin)]'); do rbd device unmap -t nbd $d; done; "
        # Stage records and mount points, once nothing is mounted under them any more.
        f"grep -q ' {KUBELET_DIR}/' /proc/mounts || rm -rf --one-file-system {STAGING_ROOT} {PODS_ROOT}",
        timeout=180,
    )


@pytest.fixture
def make_volume(vm_env: VmEnv) -> Iterator[Callable[..., VmVolume]]:
    created: list[VmVolume] = []

    def make(size_mb: int = 64, mounter: str = "", features: str = "", **context: str) -> VmVolume:
        image = f"vm-{uuid.uuid4().hex[:10]}"
        args = ["rbd", "create", "--size", f"{size_mb}M"]
        if features:
            args += ["--image-feature", features]
        vm_env.cluster.admin(*args, f"{vm_env.cluster.pool}/{image}")
        volume_id = VolumeId(vm_env.cluster.cluster_id, 1, VolumeId.new_uuid()).encode()
        ctx = {"clusterID": vm_env.cluster.cluster_id, "pool": vm_env.cluster.pool, "imageName": image, **context}
        if mounter:
            ctx["mounter"] = mounter
        volume = VmVolume(volume_id, image, ctx, vm_env.plugin, vm_env.cluster)
        created.append(volume)
        return volume

    yield make
    for volume in created:
        try:
            vm_env.cluster.admin("rbd", "rm", "--no-progress", f"{vm_env.cluster.pool}/{volume.image}", timeout=120)
        except subprocess.CalledProcessError:
            pass  # a watcher of a killed client: the cluster goes with the session
