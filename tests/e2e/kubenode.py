"""A real single-node Kubernetes for the e2e tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, containerd and a kubelet, on one node IP held by an address-only bridge.

Layout and why:
- Node IP (10.245.0.1 by default) on a bridge of its own: pods on the CNI bridge cannot reach
  127.0.0.1, so the apiserver and the Ceph test cluster listen on the node IP. The kernel has no
  `dummy` netdev, hence a bridge with an address and no ports.
- No kube-proxy: one iptables nat chain DNATs the `kubernetes` Service IP (10.0.0.1:443) to the
  apiserver, from pods (PREROUTING) and from host-network processes (OUTPUT). That is all the
  driver needs (in-cluster config); there is no cluster DNS.
- The kubelet's root is /var/lib/kubelet because deploy/node-daemonset.yaml names that path, so
  only one e2e node can run per machine: a flock on /run/lock serialises test sessions.
- containerd runs with its own root, state, socket and runc root inside the work folder, so it
  shares nothing with other users of the machine; images are imported from docker-archive tars
  (no registry is reachable). Config per the node notes: restrict_oom_score_adj (root lacks
  CAP_SYS_RESOURCE here), cgroupfs (cgroups are v1), a locally built sandbox image.
- Every host change goes through tests.e2e.host.HostChanges and is undone by stop(), which also
  kills what the kubelet started (containers, mounts, loop devices, rbd-fuse daemons) even when
  the kubelet itself did not get to clean up.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import kubernetes.client
import yaml

# _Proc is the control plane's child-process wrapper (log file, PDEATHSIG, graceful stop);
# reused so every process of the e2e node behaves the same way.
from tests.controlplane.cluster import SERVICE_CIDR, ControlPlane, ControlPlaneSettings, _Proc, binaries_dir
from tests.e2e import host
from tests.e2e.host import HostChanges

log = logging.getLogger(__name__)

NODE_BUILD_SCRIPT = Path(__file__).parent / "node" / "build.sh"
LOCK_PATH = Path("/run/lock/cephcsi-e2e-node.lock")
KUBELET_ROOT = Path("/var/lib/kubelet")
"""Fixed: deploy/node-daemonset.yaml mounts these host paths."""
DRIVER_STATE = Path("/var/lib/cephcsi")
"""The node plugin's --state-dir hostPath (Bidirectional: must be a shared mount)."""
HOST_DIRS_FOR_DEPLOY = (Path("/lib/modules"),)
"""hostPaths of type Directory in deploy/ that any real node has but this VM lacks."""
SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service: first address of SERVICE_CIDR (tests.controlplane.cluster)."""
PAUSE_IMAGE = "cephcsi.test/pause:1"
"""Name given to the static pause image by tests/e2e/node/build.sh."""
MARKER = ".cephcsi-e2e"
"""File written into KUBELET_ROOT so a later run knows a leftover folder is ours to remove."""


class NodeError(RuntimeError):
    """The e2e node could not be built, started or reached."""


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
class NodeControlPlane(ControlPlane):
    """The test control plane, served on the node IP instead of loopback, with the
    ServiceAccount admission plugin on (pods need their kube-api-access token volume)."""

    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.apiserver_port}"

    def start_apiserver(self) -> None:
        if self._apiserver is not None and self._apiserver.running():
            return
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.work_dir / 'pki'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.work_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.sa_key}",
            f"--token-auth-file={self.work_dir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # The Service IP is DNATed by an iptables rule; nothing reads the Endpoints.
            "--endpoint-reconciler-type=none",
            # exec/logs: dial the kubelet at the node IP; the node name resolves nowhere.
            "--kubelet-preferred-address-types=InternalIP",
            "--shutdown-delay-duration=0s",
            "--v=1",
        ]
        self._apiserver = _Proc("kube-apiserver", argv, self.work_dir / "kube-apiserver.log")
        self._apiserver.start()
        self._wait_ready(self._apiserver)


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
    plane: NodeControlPlane | None = None
    _lock: IO[bytes] | None = None
    _scheduler: _Proc | None = None
    _containerd: _Proc | None = None
    _kubelet: _Proc | None = None
    kubelet_starts: int = 0
    imported: list[str] = field(default_factory=list)
    """Names of the images imported at start (pause and settings.images)."""

    # ---- paths and addresses ------------------------------------------------------------------

    @property
    def ip(self) -> str:
        return self.settings.node_ip

    @property
    def name(self) -> str:
        return self.settings.node_name

    @property
    def containerd_socket(self) -> Path:
        return self.work_dir / "containerd" / "containerd.sock"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (the apiserver on the node IP)."""
        assert self.plane is not None
        return self.plane.kubeconfig

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    def api_client(self) -> kubernetes.client.ApiClient:
        assert self.plane is not None
        return self.plane.api_client()

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """Lock the machine's node slot, then network, control plane, containerd, kubelet."""
        self._take_lock()
        self.logs.mkdir(parents=True, exist_ok=True)
        self._clear_leftovers()
        self.changes.save_sysctls(host.KUBELET_SYSCTLS)
        self._prepare_host()
        self._start_control_plane()
        self._start_containerd()
        self.import_images([self.bin_dir / "pause.tar", *self.settings.images])
        self.start_kubelet()

    def stop(self) -> list[str]:
        """Tear everything down, the data path first; returns the teardown steps that failed."""
        failed: list[str] = []

        def step(what: str, action: Any) -> None:
            try:
                action()
            except Exception as error:  # noqa: BLE001 - teardown must go on
                log.warning("e2e teardown: %s failed: %s", what, error)
                failed.append(f"{what}: {error}")

        step("stop kubelet", self.stop_kubelet)
        step("stop kube-scheduler", self._stop_scheduler)
        step("remove containers", self._remove_containers)
        step("stop containerd", self._stop_containerd)
        step("kill leftover shims", self._kill_shims)
        step("release volumes", self._release_volumes)
        step("remove cgroups", lambda: host.remove_cgroups("kubepods"))
        step("stop control plane", self._stop_control_plane)
        failed.extend(self.changes.restore())
        if self.owns_work_dir:
            step("remove work folder", lambda: host.unmount_tree(str(self.work_dir)))
            step("remove work folder", lambda: host.remove_tree(self.work_dir))
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        return failed

    def _stop_scheduler(self) -> None:
        if self._scheduler is not None:
            self._scheduler.stop()

    def _stop_containerd(self) -> None:
        if self._containerd is not None:
            self._containerd.stop(timeout=30)

    def _stop_control_plane(self) -> None:
        if self.plane is not None:
            self.plane.stop()

    # ---- kubelet ------------------------------------------------------------------------------------

    def start_kubelet(self) -> None:
        """Start the kubelet and wait until the Node is Ready."""
        config = self.work_dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config()))
        kubeconfig = self.work_dir / "kubelet.kubeconfig"
        assert self.plane is not None
        self.plane.write_kubeconfig(kubeconfig)
        argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={KUBELET_ROOT}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            "--v=2",
        ]
        self._kubelet = _Proc("kubelet", argv, self.logs / "kubelet.log")
        self._kubelet.start()
        self.kubelet_starts += 1
        self.wait_node_ready(self.settings.start_timeout)

    def stop_kubelet(self) -> None:
        """SIGTERM the kubelet (containers keep running, as on a real kubelet restart)."""
        if self._kubelet is not None:
            self._kubelet.stop(graceful=True, timeout=30)

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()

    def kubelet_running(self) -> bool:
        return self._kubelet is not None and self._kubelet.running()

    def wait_node_ready(self, timeout: float) -> None:
        """Poll the Node's Ready condition (and the kubelet's own /healthz)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._kubelet is not None and not self._kubelet.running():
                raise NodeError(f"kubelet exited:\n{self._kubelet.log_tail()}")
            if self._kubelet_healthy() and self._node_ready():
                return
            time.sleep(0.5)
        tail = self._kubelet.log_tail() if self._kubelet else ""
        raise NodeError(f"node {self.name} not Ready within {timeout}s:\n{tail}")

    def kubelet_pod_uids(self) -> set[str]:
        """UIDs of the pods the kubelet itself manages (its /pods endpoint), empty while it does
        not answer. The API's pod status can be stale right after a kubelet restart; this is the
        kubelet's own view."""
        context = ssl.create_default_context()
        # The kubelet's self-signed serving certificate, on a private address of this machine.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(f"https://{self.ip}:10250/pods", timeout=5, context=context) as reply:
                return {item["metadata"]["uid"] for item in json.load(reply).get("items") or []}
        except (OSError, urllib.error.URLError, ValueError):
            return set()

    def _kubelet_healthy(self) -> bool:
        try:
            with urllib.request.urlopen("http://127.0.0.1:10248/healthz", timeout=2) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _node_ready(self) -> bool:
        with self.api_client() as client:
            try:
                node = kubernetes.client.CoreV1Api(client).read_node(self.name)
            except kubernetes.client.ApiException:
                return False
        return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            # The apiserver reaches the kubelet (exec, logs) without a client certificate;
            # nothing else can reach the node IP.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            # cgroups are v1 here and containerd runs runc with cgroupfs.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.work_dir / "pod-logs"),
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            "syncFrequency": f"{self.settings.kubelet_sync_seconds}s",
            "serializeImagePulls": False,
            # Never garbage-collect the imported images (they cannot be pulled back) and never
            # evict test pods because the shared disk is busy.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "protectKernelDefaults": False,
        }

    # ---- containerd ---------------------------------------------------------------------------------

    def ctr(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        """`ctr` against this node's containerd, namespace k8s.io (the CRI's)."""
        return host.run(["ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args],
                        timeout=timeout, check=check)

    def import_images(self, tars: list[Path]) -> list[str]:
        """Import docker-archive tars; the image names they held."""
        names = []
        for tar in tars:
            started = time.monotonic()
            out = self.ctr("images", "import", str(tar), timeout=600)
            # ctr prints "unpacking NAME (sha256:...)...done" per image.
            names += [line.split()[1] for line in out.splitlines() if line.startswith("unpacking ")]
            log.info("imported %s in %.1fs", tar, time.monotonic() - started)
        self.imported.extend(names)
        return names

    def tag_image(self, source: str, target: str) -> None:
        self.ctr("images", "tag", "--force", source, target)

    def _start_containerd(self) -> None:
        base = self.work_dir / "containerd"
        base.mkdir(parents=True, exist_ok=True)
        cni = self.work_dir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-e2e.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        config = base / "config.toml"
        config.write_text(CONTAINERD_CONFIG.format(
            root=base / "root", state=base / "state", socket=self.containerd_socket,
            sandbox=PAUSE_IMAGE, cni_conf=cni / "net.d", runc_root=base / "runc",
        ))
        self._containerd = _Proc("containerd", ["containerd", "--config", str(config)],
                                 self.logs / "containerd.log")
        self._containerd.start()
        deadline = time.monotonic() + self.settings.start_timeout
        while time.monotonic() < deadline:
            if not self._containerd.running():
                raise NodeError(f"containerd exited:\n{self._containerd.log_tail()}")
            if self.containerd_socket.exists() and subprocess.run(
                    ["ctr", "--address", str(self.containerd_socket), "version"],
                    capture_output=True, check=False, timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise NodeError(f"containerd not serving within {self.settings.start_timeout}s")

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": "cephcsi-e2e",
            "plugins": [{
                "type": "bridge",
                "bridge": self.settings.cni_bridge,
                "isGateway": True,
                # No masquerade: pods talk only to the node IP, inside this machine.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.settings.pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(self.work_dir / "cni" / "ipam"),
                },
            }],
        }

    def _remove_containers(self) -> None:
        """Kill and delete every container of this containerd (the kubelet is stopped first, so
        nothing restarts them). Pods' volumes stay mounted; _release_volumes undoes those."""
        if self._containerd is None or not self._containerd.running():
            return

        def tasks() -> dict[str, str]:
            rows = [line.split() for line in self.ctr("tasks", "ls", check=False).splitlines()[1:]]
            return {row[0]: row[-1] for row in rows if row}

        for task in tasks():
            self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, check=False)
        host.wait_until("every container stopped",
                        lambda: all(status != "RUNNING" for status in tasks().values()), timeout=60)
        for task in tasks():
            self.ctr("tasks", "rm", "--force", task, check=False)
        for container in self.ctr("containers", "ls", "-q", check=False).split():
            self.ctr("containers", "rm", container, check=False)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes outlive containerd; ours name our socket."""
        socket = str(self.containerd_socket)
        for pid, argv in host.processes():
            if os.path.basename(argv[0]).startswith("containerd-shim") and socket in argv:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    # ---- host ---------------------------------------------------------------------------------------

    def _take_lock(self) -> None:
        """One e2e node per machine (the kubelet's root and the driver's paths are fixed)."""
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        handle = open(LOCK_PATH, "wb")
        deadline = time.monotonic() + self.settings.lock_timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise NodeError(f"another e2e node holds {LOCK_PATH} for more than "
                                    f"{self.settings.lock_timeout}s") from None
                time.sleep(2)
        self._lock = handle

    def _clear_leftovers(self) -> None:
        """A session that died hard leaves its folders (KUBELET_ROOT with our marker) and maybe
        mounts; a kubelet folder without the marker belongs to a real kubelet: refuse to touch it."""
        if KUBELET_ROOT.exists() and not (KUBELET_ROOT / MARKER).exists():
            raise NodeError(f"{KUBELET_ROOT} exists and was not made by the e2e tests; is a real "
                            "kubelet installed on this machine? Remove it or use another machine.")
        if DRIVER_STATE.exists() and not KUBELET_ROOT.exists() and any(DRIVER_STATE.iterdir()):
            raise NodeError(f"{DRIVER_STATE} exists and is not empty; is cephcsi's node plugin "
                            "running on this machine? Remove it or use another machine.")
        if KUBELET_ROOT.exists() or DRIVER_STATE.exists():
            log.warning("removing the leftovers of an earlier e2e run")
            self._release_volumes()
            host.remove_tree(DRIVER_STATE)
            host.remove_tree(KUBELET_ROOT)
        for link in (self.settings.node_bridge, self.settings.cni_bridge):
            host.delete_link(link)

    def _prepare_host(self) -> None:
        s = self.settings
        # Remove the leftovers of the pod network at the end (CNI makes the bridge, containerd
        # the namespaces; /var/lib/cni holds libcni's result cache).
        self.changes.ensure_dir(Path("/var/lib/cni"))
        self.changes.remove_link_at_end(s.cni_bridge)
        self.changes.remove_new_netns()
        self.changes.remove_new_kube_chains()
        self.changes.add_address_bridge(s.node_bridge, s.node_ip)
        # With no default route a connect() to the Service IP fails before netfilter sees it.
        if not host.run(["ip", "route", "get", SERVICE_IP], check=False).strip():
            host.run(["ip", "route", "add", f"{SERVICE_IP}/32", "dev", s.node_bridge])
        self._share_netns_dir()
        for path in HOST_DIRS_FOR_DEPLOY:
            self.changes.ensure_dir(path)
        self.changes.ensure_dir(Path("/run/mount"))
        self.changes.ensure_dir(KUBELET_ROOT)
        (KUBELET_ROOT / MARKER).write_text("made by tests/e2e (cephcsi); safe to remove\n")
        self.changes.ensure_dir(DRIVER_STATE)
        self.changes.make_rshared(DRIVER_STATE)
        # After the mounts are undone and before the folders are removed (undo runs backwards).
        self.changes.on_restore("release kubelet and driver mounts", self._release_volumes)

    @staticmethod
    def _share_netns_dir() -> None:
        """Make /run/netns a shared bind mount of itself before containerd mounts pod network
        namespaces in it, as `ip netns` does. Otherwise another tool doing that later (podman
        does) covers our nsfs mounts with its bind, and containerd's unlink of them fails with
        EBUSY: pods then hang in Terminating. Left in place at the end, like iproute2 leaves
        it: removing it could strand other users' namespaces the same way."""
        netns = Path("/run/netns")
        netns.mkdir(parents=True, exist_ok=True)
        if not any(m.mount_point == str(netns) for m in host.mounts()):
            host.run(["mount", "--bind", str(netns), str(netns)])
        host.run(["mount", "--make-rshared", str(netns)])

    def _start_control_plane(self) -> None:
        plane = NodeControlPlane(
            settings=ControlPlaneSettings(bin_dir=self.control_plane_bin, work_dir=self.work_dir / "cp",
                                          start_timeout=self.settings.start_timeout),
            bin_dir=self.control_plane_bin, work_dir=self.work_dir / "cp", owns_work_dir=False,
            host=self.ip,
        )
        plane.work_dir.mkdir(parents=True, exist_ok=True)
        self.plane = plane
        plane.start()
        # Reach the apiserver at the Service IP like any pod does (in-cluster config).
        self.changes.nat_chain("CEPHCSI-E2E", [[
            "-d", f"{SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
            "-j", "DNAT", "--to-destination", f"{self.ip}:{plane.apiserver_port}",
        ]], hooks=("PREROUTING", "OUTPUT"))
        plane.start_controller_manager(["*"])
        self._scheduler = _Proc("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={plane.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ], self.logs / "kube-scheduler.log")
        self._scheduler.start()

    def _release_volumes(self) -> None:
        """Whatever the kubelet and the node plugin left mounted: pod bind mounts and filesystems
        first, then loop devices (they hold rbd-fuse files open), then rbd-fuse mounts and
        daemons, then the remaining mounts (the kubelet's and our shared self-binds)."""
        roots = [str(KUBELET_ROOT), str(DRIVER_STATE)]
        for root in roots:
            for mount in sorted(host.mounts_under(root), key=lambda m: m.mount_id, reverse=True):
                if not mount.fstype.startswith("fuse") and mount.mount_point not in roots:
                    subprocess.run(["umount", mount.mount_point], capture_output=True, check=False)
        for root in roots:
            host.release_data_path(root)
        if self.work_dir.exists():
            host.unmount_tree(str(self.work_dir))


CONTAINERD_CONFIG = """\
version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  # root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj makes runc init fail.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
"""


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
