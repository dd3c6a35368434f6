"""The e2e node's control plane: tests.controlplane's etcd, kube-apiserver and
kube-controller-manager, served on the node IP, plus a kube-scheduler and the `kubernetes`
Service.

- Served on the node IP, not loopback: pods on the CNI bridge cannot reach 127.0.0.1.
- No kube-proxy: one iptables nat chain DNATs the `kubernetes` Service IP (10.0.0.1:443) to the
  apiserver, from pods (PREROUTING) and from host-network processes (OUTPUT). That is all the
  driver needs (in-cluster config); there is no cluster DNS.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.process import Proc
from tests.e2e.host import HostChanges

SERVICE_IP = "10.0.0.1"
"""The `kubernetes` Service: first address of SERVICE_CIDR (tests.controlplane.cluster)."""
NAT_CHAIN = "CEPHCSI-E2E"


@dataclass
class NodeControlPlane(ControlPlane):
    """The test control plane, served on the node IP instead of loopback, with the
    ServiceAccount admission plugin on (pods need their kube-api-access token volume)."""

    host: str = "127.0.0.1"
    _scheduler: Proc | None = None

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.apiserver_port}"

    def _apiserver_argv(self) -> list[str]:
        return [
            *self._apiserver_base_argv(self.host),
            "--allow-privileged=true",
            # The Service IP is DNATed by an iptables rule; nothing reads the Endpoints.
            "--endpoint-reconciler-type=none",
            # exec/logs: dial the kubelet at the node IP; the node name resolves nowhere.
            "--kubelet-preferred-address-types=InternalIP",
            "--shutdown-delay-duration=0s",
            "--v=1",
        ]

    def route_service_ip(self, changes: HostChanges) -> None:
        """Reach the apiserver at the Service IP like any pod does (in-cluster config)."""
        changes.nat_chain(NAT_CHAIN, [[
            "-d", f"{SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
            "-j", "DNAT", "--to-destination", f"{self.host}:{self.apiserver_port}",
        ]], hooks=("PREROUTING", "OUTPUT"))

    def start_scheduler(self, binary: Path, log_path: Path) -> None:
        """kube-scheduler (tests/controlplane builds none: `binary` is the node's)."""
        self._scheduler = Proc("kube-scheduler", [
            str(binary),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            "--v=1",
        ], log_path)
        self._scheduler.start()

    def stop_scheduler(self) -> None:
        if self._scheduler is not None:
            self._scheduler.stop()
