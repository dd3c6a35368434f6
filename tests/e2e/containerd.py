"""The e2e node's container runtime: containerd with its config, its CNI network, `ctr` against
it, image import and the clean-up of what it ran.

containerd runs with its own root, state, socket and runc root inside the work folder, so it
shares nothing with other users of the machine; images are imported from docker-archive tars
(no registry is reachable). Config per the node notes: restrict_oom_score_adj (root lacks
CAP_SYS_RESOURCE here), cgroupfs (cgroups are v1), a locally built sandbox image.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.controlplane.process import Proc
from tests.e2e import host
from tests.e2e.nodehost import NodeError

log = logging.getLogger(__name__)

PAUSE_IMAGE = "cephcsi.test/pause:1"
"""Name given to the static pause image by tests/e2e/node/build.sh."""


@dataclass
class Containerd:
    """containerd and its CNI config under work_dir (containerd/, cni/); see the module docstring."""

    work_dir: Path
    log_path: Path
    cni_bridge: str
    pod_subnet: str
    start_timeout: float
    imported: list[str] = field(default_factory=list)
    """Names of the images imported so far."""
    _proc: Proc | None = None

    @property
    def socket(self) -> Path:
        return self.work_dir / "containerd" / "containerd.sock"

    def start(self) -> None:
        """Write the CNI and containerd configs, start containerd, wait until `ctr` reaches it."""
        for path, text in self.config_files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        config = self.config_path
        self._proc = Proc("containerd", ["containerd", "--config", str(config)], self.log_path)
        self._proc.start()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not self._proc.running():
                raise NodeError(f"containerd exited:\n{self._proc.log_tail()}")
            if self.socket.exists() and subprocess.run(
                    ["ctr", "--address", str(self.socket), "version"],
                    capture_output=True, check=False, timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise NodeError(f"containerd not serving within {self.start_timeout}s")

    @property
    def config_path(self) -> Path:
        return self.work_dir / "containerd" / "config.toml"

    def config_files(self) -> dict[Path, str]:
        """containerd's config and the CNI network, by path (also written into a VM node's disk
        by tests/vm/kube_node.py, where work_dir is a path of the guest)."""
        base = self.work_dir / "containerd"
        cni_conf = self.work_dir / "cni" / "net.d"
        return {
            cni_conf / "10-e2e.conflist": json.dumps(self._cni_config(), indent=2),
            self.config_path: CONFIG.format(
                root=base / "root", state=base / "state", socket=self.socket,
                sandbox=PAUSE_IMAGE, cni_conf=cni_conf, runc_root=base / "runc",
            ),
        }

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop(timeout=30)

    def ctr(self, *args: str, timeout: float = 120.0, check: bool = True) -> str:
        """`ctr` against this containerd, namespace k8s.io (the CRI's)."""
        return host.run(["ctr", "--address", str(self.socket), "-n", "k8s.io", *args],
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

    def remove_containers(self) -> None:
        """Kill and delete every container of this containerd (stop the kubelet first, so that
        nothing restarts them). Pods' volumes stay mounted (NodeHost.release_volumes)."""
        if self._proc is None or not self._proc.running():
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

    def kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes outlive containerd; ours name our socket."""
        socket = str(self.socket)
        for pid, argv in host.processes():
            if os.path.basename(argv[0]).startswith("containerd-shim") and socket in argv:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": "cephcsi-e2e",
            "plugins": [{
                "type": "bridge",
                "bridge": self.cni_bridge,
                "isGateway": True,
                # No masquerade: pods talk only to the node IP, inside this machine.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(self.work_dir / "cni" / "ipam"),
                },
            }],
        }


CONFIG = """\
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
