"""The peers a run needs — the real Ceph test cluster and cephcsi processes — started once and
shared by the sections, and always stopped at the end (also on Ctrl-C or a failing section)."""
from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procstat
from bench.options import Options
from tests.ceph.fixtures import CephTestCluster, start_cluster, stop_cluster
from tests.integration.driver import DriverProcess

log = logging.getLogger("bench")

# Production-like flags: INFO logging (the test helper's default is DEBUG, which costs CPU per
# call) and the driver's default Ceph timeouts.
DRIVER_ARGS = ("--log-level=info",)


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first (from /proc/self/mountinfo)."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def unmount_under(root: Path) -> bool:
    """Unmount everything below `root` (lazily if busy); True when nothing is left mounted."""
    for point in mounts_under(root):
        log.warning("unmounting leftover %s", point)
        if subprocess.run(["umount", point], capture_output=True, timeout=60, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=60, check=False)
    return not mounts_under(root)


@dataclass
class Environment:
    options: Options
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="bn-", dir="/tmp")))
    cluster: CephTestCluster | None = None
    config_file: str = ""
    _controller: DriverProcess | None = None
    _node: DriverProcess | None = None
    controller_samples: dict[str, procstat.ProcessSample] = field(default_factory=dict)
    """Controller /proc samples by label, in the order taken (sections add to it)."""
    node_samples: dict[str, procstat.ProcessSample] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    """Figures one section leaves for a later one (e.g. CPU seconds of the create/delete batches)."""
    ceph_versions: str = ""
    _kube: Any = None
    """bench.kube.KubeSetup once a Kubernetes section asked for it (control plane + kcm)."""

    # ---- Ceph ----------------------------------------------------------------------------------

    def start_cluster(self) -> CephTestCluster:
        if self.cluster is None:
            # Short folder: the daemons' unix socket paths must stay under 107 bytes.
            cluster_dir = str(self.workdir / "c")
            log.info("starting the Ceph test cluster in %s", cluster_dir)
            try:
                self.cluster = start_cluster(cluster_dir)
            except Exception:
                stop_cluster(cluster_dir)
                raise
            self.config_file = self.cluster.write_config(self.workdir / "config.json")
            try:
                self.ceph_versions = self.cluster.admin("ceph", "version").strip()
            except Exception:  # noqa: BLE001 - informational only
                self.ceph_versions = ""
        return self.cluster

    # ---- cephcsi processes ----------------------------------------------------------------------

    def controller(self) -> DriverProcess:
        """The shared `cephcsi --mode=controller --sidecars=none` process (started on first use;
        its first /proc sample, 'started', is taken right after it serves)."""
        if self._controller is None:
            self.start_cluster()
            process = DriverProcess(self.config_file, mode="controller", args=DRIVER_ARGS,
                                    workdir=tempfile.mkdtemp(prefix="ctl-", dir=self.workdir))
            process.start()
            self._controller = process
            self.sample_controller("started (serving, no Ceph connection yet)")
        return self._controller

    def controller_pid(self) -> int:
        process = self.controller().process
        assert process is not None
        return process.pid

    def sample_controller(self, label: str) -> procstat.ProcessSample:
        s = procstat.sample(self.controller_pid())
        self.controller_samples[label] = s
        return s

    def node(self, extra_args: tuple[str, ...] = ()) -> DriverProcess:
        """The shared `cephcsi --mode=node` process (rbd-fuse mapper, kubelet dir in the workdir)."""
        if self._node is None:
            self.start_cluster()
            kubelet = self.workdir / "kubelet"
            state = self.workdir / "state"
            kubelet.mkdir(exist_ok=True)
            state.mkdir(exist_ok=True)
            args = (*DRIVER_ARGS, "--nodeid=bench-node", "--mounter=fuse", f"--kubelet-dir={kubelet}",
                    f"--state-dir={state}", *extra_args)
            process = DriverProcess(self.config_file, mode="node", args=args,
                                    workdir=tempfile.mkdtemp(prefix="nod-", dir=self.workdir))
            try:
                process.start()
            except Exception:
                process.stop()
                raise
            self._node = process
            assert process.process is not None
            self.node_samples["started (serving)"] = procstat.sample(process.process.pid)
        return self._node

    def kube(self) -> Any:
        """The shared Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager's
        volume controllers) with the Ceph Secret in place: a bench.kube.KubeSetup, started on
        first use and stopped in close()."""
        if self._kube is None:
            self.start_cluster()
            from bench.kube import start_kube  # kubernetes client: imported only when needed

            self._kube = start_kube(self.config_file, self.cluster)
        return self._kube

    @property
    def kubelet_dir(self) -> Path:
        return self.workdir / "kubelet"

    # ---- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        if self._kube is not None:
            try:
                self._kube.close()
            except Exception as error:  # noqa: BLE001 - keep tearing down
                log.warning("stopping the control plane failed: %s", error)
            self._kube = None
        for process in (self._node, self._controller):
            if process is not None:
                try:
                    process.stop()
                except Exception as error:  # noqa: BLE001 - keep tearing down
                    log.warning("stopping %s failed: %s", process.mode, error)
        self._node = self._controller = None
        if self.cluster is not None:
            stop_cluster(self.cluster.directory)
            self.cluster = None
        # Never recurse into a filesystem a section left mounted (or an rbd-fuse mount).
        if unmount_under(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            log.warning("left %s in place: something under it is still mounted", self.workdir)

    def __enter__(self) -> Environment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
