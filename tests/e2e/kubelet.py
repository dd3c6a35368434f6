"""The e2e node's kubelet: its configuration, its process and whether it (and its Node) is ready.

Its root is the fixed KUBELET_ROOT (see tests.e2e.nodehost); everything else it writes (config,
kubeconfig, pod logs) goes to the node's work folder.
"""
from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.process import Proc
from tests.e2e.nodehost import KUBELET_ROOT, NodeError


@dataclass
class Kubelet:
    """The kubelet of node `node_name`, registered with `plane`, running its pods in the
    containerd at `runtime_socket`."""

    binary: Path
    plane: ControlPlane
    node_name: str
    node_ip: str
    runtime_socket: Path
    work_dir: Path
    log_path: Path
    sync_seconds: int
    start_timeout: float
    starts: int = 0
    _proc: Proc | None = None

    def start(self) -> None:
        """Start the kubelet and wait until the Node is Ready."""
        config = self.work_dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self.config()))
        kubeconfig = self.work_dir / "kubelet.kubeconfig"
        self.plane.write_kubeconfig(kubeconfig)
        self._proc = Proc("kubelet", self.argv(config, kubeconfig), self.log_path)
        self._proc.start()
        self.starts += 1
        self.wait_ready(self.start_timeout)

    def stop(self) -> None:
        """SIGTERM the kubelet (containers keep running, as on a real kubelet restart)."""
        if self._proc is not None:
            self._proc.stop(graceful=True, timeout=30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return self._proc is not None and self._proc.running()

    def wait_ready(self, timeout: float) -> None:
        """Poll the Node's Ready condition (and the kubelet's own /healthz)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and not self._proc.running():
                raise NodeError(f"kubelet exited:\n{self._proc.log_tail()}")
            if self._healthy() and self.node_ready():
                return
            time.sleep(0.5)
        tail = self._proc.log_tail() if self._proc else ""
        raise NodeError(f"node {self.node_name} not Ready within {timeout}s:\n{tail}")

    def pod_uids(self) -> set[str]:
        """UIDs of the pods the kubelet itself manages (its /pods endpoint), empty while it does
        not answer. The API's pod status can be stale right after a kubelet restart; this is the
        kubelet's own view."""
        context = ssl.create_default_context()
        # The kubelet's self-signed serving certificate, on a private address of this machine.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(f"https://{self.node_ip}:10250/pods", timeout=5, context=context) as reply:
                return {item["metadata"]["uid"] for item in json.load(reply).get("items") or []}
        except (OSError, urllib.error.URLError, ValueError):
            return set()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen("http://127.0.0.1:10248/healthz", timeout=2) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def node_ready(self) -> bool:
        with self.plane.api_client() as client:
            try:
                node = kubernetes.client.CoreV1Api(client).read_node(self.node_name)
            except kubernetes.client.ApiException:
                return False
        return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))

    def argv(self, config: Path, kubeconfig: Path) -> list[str]:
        """The command line, given where its config and kubeconfig are (a VM node's kubelet,
        tests/vm/kube_node.py, runs the same one inside the guest)."""
        return [
            str(self.binary),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={KUBELET_ROOT}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.node_ip}",
            "--v=2",
        ]

    def config(self) -> dict[str, Any]:
        """The KubeletConfiguration."""
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            # The apiserver reaches the kubelet (exec, logs) without a client certificate;
            # nothing else can reach the node IP.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.runtime_socket}",
            # cgroups are v1 here and containerd runs runc with cgroupfs.
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(self.work_dir / "pod-logs"),
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            "syncFrequency": f"{self.sync_seconds}s",
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
