"""A real single-node Kubernetes for the e2e tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd and a kubelet, on one node IP held by an address-only bridge.

KubeNode composes the parts, each in its own module with the reasons for its layout:
- tests.e2e.nodehost: the machine (lock, leftovers, node IP bridge, fixed folders, shared mounts);
- tests.e2e.nodeplane: the control plane on the node IP and the `kubernetes` Service's DNAT;
- tests.e2e.containerd: containerd, its CNI network and images;
- tests.e2e.kubelet: the kubelet.
Every host change goes through tests.e2e.host.HostChanges and is undone by stop(), which also
kills what the kubelet started (containers, mounts, loop devices, rbd-fuse daemons) even when
the kubelet itself did not get to clean up.
"""
from __future__ import annotations

import logging
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client

from tests.controlplane.cluster import ControlPlaneSettings, binaries_dir
from tests.e2e import host
from tests.e2e.containerd import Containerd
from tests.e2e.host import HostChanges
from tests.e2e.kubelet import Kubelet
from tests.e2e.nodehost import NodeError, NodeHost
from tests.e2e.nodeplane import NodeControlPlane

log = logging.getLogger(__name__)

NODE_BUILD_SCRIPT = Path(__file__).parent / "node" / "build.sh"


def node_binaries(timeout: float = 3600.0) -> Path:
    """Run tests/e2e/node/build.sh (a no-op once built) and return its bin folder."""
    proc = subprocess.run(["bash", str(NODE_BUILD_SCRIPT)], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise NodeError(f"{NODE_BUILD_SCRIPT} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class NodeSettings:
    """Where and how the node runs."""

    node_ip: str = "10.245.0.1"
    """The node's only address; a private /32 used inside this machine only."""
    pod_subnet: str = "10.246.0.0/24"
    """The CNI bridge's host-local range (no masquerade: pods talk only to the node IP)."""
    node_name: str = "e2e-node"
    node_bridge: str = "ce2e-node"
    """Link holding node_ip (names are limited to 15 characters)."""
    cni_bridge: str = "ce2e-cni0"
    work_dir: Path | None = None
    """Everything but the fixed kubelet/driver paths; None → a fresh /tmp folder, removed on stop."""
    images: tuple[Path, ...] = ()
    """docker-archive tars imported into containerd's k8s.io namespace at start."""
    start_timeout: float = 120.0
    lock_timeout: float = 1800.0
    """How long to wait for another test session's node to go away."""
    kubelet_sync_seconds: int = 10
    """syncFrequency: how soon the kubelet refreshes ConfigMap volumes (default 1 min)."""


@dataclass
class KubeNode:
    """See the module docstring. start() brings everything up; stop() takes it all down."""

    settings: NodeSettings
    bin_dir: Path
    """kubelet, kube-scheduler, kubectl, pause.tar (tests/e2e/node/build.sh)."""
    control_plane_bin: Path
    """etcd, kube-apiserver, kube-controller-manager (tests/controlplane/build.sh)."""
    work_dir: Path
    owns_work_dir: bool
    changes: HostChanges = field(default_factory=HostChanges)
    machine: NodeHost = field(init=False)
    plane: NodeControlPlane = field(init=False)
    containerd: Containerd = field(init=False)
    kubelet: Kubelet = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        self.machine = NodeHost(changes=self.changes, work_dir=self.work_dir, node_ip=s.node_ip,
                                node_bridge=s.node_bridge, cni_bridge=s.cni_bridge, lock_timeout=s.lock_timeout)
        self.plane = NodeControlPlane(
            settings=ControlPlaneSettings(bin_dir=self.control_plane_bin, work_dir=self.work_dir / "cp",
                                          start_timeout=s.start_timeout),
            bin_dir=self.control_plane_bin, work_dir=self.work_dir / "cp", owns_work_dir=False,
            host=s.node_ip,
        )
        self.containerd = Containerd(work_dir=self.work_dir, log_path=self.logs / "containerd.log",
                                     cni_bridge=s.cni_bridge, pod_subnet=s.pod_subnet, start_timeout=s.start_timeout)
        self.kubelet = Kubelet(binary=self.bin_dir / "kubelet", plane=self.plane, node_name=s.node_name,
                               node_ip=s.node_ip, runtime_socket=self.containerd.socket, work_dir=self.work_dir,
                               log_path=self.logs / "kubelet.log", sync_seconds=s.kubelet_sync_seconds,
                               start_timeout=s.start_timeout)

    # ---- paths, addresses and the parts the scenarios use -----------------------------------------

    @property
    def ip(self) -> str:
        return self.settings.node_ip

    @property
    def name(self) -> str:
        return self.settings.node_name

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (the apiserver on the node IP)."""
        return self.plane.kubeconfig

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    @property
    def imported(self) -> list[str]:
        """Names of the images imported at start (pause and settings.images)."""
        return self.containerd.imported

    def api_client(self) -> kubernetes.client.ApiClient:
        return self.plane.api_client()

    def tag_image(self, source: str, target: str) -> None:
        self.containerd.tag_image(source, target)

    def restart_kubelet(self) -> None:
        self.kubelet.restart()

    def kubelet_pod_uids(self) -> set[str]:
        return self.kubelet.pod_uids()

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Lock the machine's node slot, then network, control plane, containerd, kubelet."""
        self.machine.take_lock()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.machine.clear_leftovers()
        self.changes.save_sysctls(host.KUBELET_SYSCTLS)
        self.machine.prepare()
        self._start_control_plane()
        self.containerd.start()
        self.containerd.import_images([self.bin_dir / "pause.tar", *self.settings.images])
        self.kubelet.start()

    def stop(self) -> list[str]:
        """Tear everything down, the data path first; returns the teardown steps that failed."""
        failed: list[str] = []

        def step(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as error:  # noqa: BLE001 - teardown must go on
                log.warning("e2e teardown: %s failed: %s", what, error)
                failed.append(f"{what}: {error}")

        step("stop kubelet", self.kubelet.stop)
        step("stop kube-scheduler", self.plane.stop_scheduler)
        step("remove containers", self.containerd.remove_containers)
        step("stop containerd", self.containerd.stop)
        step("kill leftover shims", self.containerd.kill_shims)
        step("release volumes", self.machine.release_volumes)
        step("remove cgroups", lambda: host.remove_cgroups("kubepods"))
        step("stop control plane", self.plane.stop)
        failed.extend(self.changes.restore())
        if self.owns_work_dir:
            step("remove work folder", lambda: host.unmount_tree(str(self.work_dir)))
            step("remove work folder", lambda: host.remove_tree(self.work_dir))
        self.machine.release_lock()
        return failed

    def _start_control_plane(self) -> None:
        plane = self.plane
        plane.work_dir.mkdir(parents=True, exist_ok=True)
        plane.start()
        plane.route_service_ip(self.changes)
        plane.start_controller_manager(["*"])
        plane.start_scheduler(self.bin_dir / "kube-scheduler", self.logs / "kube-scheduler.log")


def start_node(settings: NodeSettings | None = None) -> KubeNode:
    """Build (cached) and start the node; the caller must call stop()."""
    settings = settings or NodeSettings()
    bin_dir = node_binaries()
    cp_bin = binaries_dir()
    if settings.work_dir is None:
        work_dir, owns = Path(tempfile.mkdtemp(prefix="ce2e-", dir="/tmp")), True
    else:
        work_dir, owns = settings.work_dir, False
        work_dir.mkdir(parents=True, exist_ok=True)
    node = KubeNode(settings=settings, bin_dir=bin_dir, control_plane_bin=cp_bin, work_dir=work_dir,
                    owns_work_dir=owns)
    try:
        node.start()
    except BaseException:
        failed = node.stop()
        if failed:
            log.warning("e2e node teardown after a failed start left: %s", failed)
        raise
    return node
