"""A VM node joining the e2e tier's control plane: containerd and a kubelet inside the guest,
configured by the same code as the e2e node's (tests.e2e.containerd, tests.e2e.kubelet), with
guest paths, so the deploy/ DaemonSet puts the node plugin there and pods pinned to the node get
their volumes through krbd on a stock kernel.

What differs from the host's node, and why:
- the binaries and images come on the Kubernetes disk (tests/vm/kube_disk.py), /dev/vdb,
  mounted at GUEST_ROOT; containerd's config and the CNI network are the e2e node's with
  GUEST_ROOT as work folder, and a pod subnet (POD_SUBNET) of the VM's own;
- the control plane listens on the e2e node IP of the host: the guest routes that one address
  via the host's bridge address (the host answers for its own addresses, nothing is forwarded)
  and DNATs the `kubernetes` Service IP to it, as the host node does (no kube-proxy);
- the guest runs cgroup v2 under systemd: the controllers the kubelet's cgroupfs driver needs
  are enabled at the root; root has every capability there, so nothing else changes.
Both daemons run in the background (`VmNode.spawn`); their logs are in the control share.
"""
from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client
import yaml

from tests.e2e.containerd import Containerd
from tests.e2e.kubelet import Kubelet
from tests.e2e.nodeplane import SERVICE_IP, NodeControlPlane
from tests.vm import network
from tests.vm.kube_disk import GUEST_KUBELET, GUEST_ROOT
from tests.vm.machine import VmError, VmNode, scaled

POD_SUBNET = "10.248.0.0/24"
"""The guest's CNI bridge range (the host node uses 10.246.0.0/24, the VM bridge 10.247.0.0/24)."""
CNI_BRIDGE = "cvm-cni0"
CGROUP_CONTROLLERS = "+cpu +cpuset +memory +pids +io"


@dataclass
class VmKubelet:
    """containerd + kubelet in `vm`, registered as Node `vm.hostname` with `plane`."""

    vm: VmNode
    plane: NodeControlPlane
    containerd: Containerd = field(init=False)
    kubelet: Kubelet = field(init=False)

    def __post_init__(self) -> None:
        self.containerd = Containerd(work_dir=GUEST_ROOT, log_path=Path(self.vm.guest_path("containerd.log")),
                                     cni_bridge=CNI_BRIDGE, pod_subnet=POD_SUBNET, start_timeout=0)
        self.kubelet = Kubelet(binary=GUEST_KUBELET, plane=self.plane, node_name=self.vm.hostname,
                               node_ip=self.vm.address, runtime_socket=self.containerd.socket,
                               work_dir=GUEST_ROOT / "kubelet", log_path=Path(self.vm.guest_path("kubelet.log")),
                               sync_seconds=10, start_timeout=0)

    @property
    def name(self) -> str:
        return self.vm.hostname

    def replace_vm(self, vm: VmNode) -> None:
        """The same node after its VM was booted again (same index: same address and hostname);
        `start` then joins it again."""
        self.vm = vm
        self.__post_init__()

    def start(self, timeout: float = 300) -> None:
        """Mount the disk, set up the network, start containerd and the kubelet, wait until the
        Node is Ready."""
        vm, plane = self.vm, self.plane
        vm.check(f"mkdir -p {GUEST_ROOT} && mount -o noatime /dev/vdb {GUEST_ROOT} && "
                 f"mkdir -p {self.kubelet.work_dir}", timeout=60)
        vm.check(
            f"ip route replace {plane.host}/32 via {network.HOST_ADDRESS} && "
            f"iptables -t nat -A OUTPUT -d {SERVICE_IP}/32 -p tcp --dport 443 "
            f"-j DNAT --to-destination {plane.host}:{plane.apiserver_port} && "
            # Not every controller may be available; the kubelet says which one it misses.
            f"(echo {shlex.quote(CGROUP_CONTROLLERS)} > /sys/fs/cgroup/cgroup.subtree_control || true)",
            timeout=60)
        for path, text in self.containerd.config_files().items():
            self._put(path, text)
        vm.spawn(f"exec containerd --config {self.containerd.config_path}", "containerd")
        self._wait("containerd serving", lambda: vm.run(
            f"ctr --address {self.containerd.socket} version", timeout=30).ok, timeout=120)

        config = self.kubelet.work_dir / "kubelet.yaml"
        self._put(config, yaml.safe_dump(self.kubelet.config()))
        self._put(self.kubelet.work_dir / "ca.crt", plane.ca_file.read_text())
        kubeconfig = json.loads(plane.write_kubeconfig(Path(vm.host_path("kubeconfig"))).read_text())
        Path(vm.host_path("kubeconfig")).unlink()
        kubeconfig["clusters"][0]["cluster"]["certificate-authority"] = str(self.kubelet.work_dir / "ca.crt")
        kubeconfig_path = self.kubelet.work_dir / "kubelet.kubeconfig"
        self._put(kubeconfig_path, json.dumps(kubeconfig), mode="0600")
        vm.spawn("exec " + shlex.join(self.kubelet.argv(config, kubeconfig_path)), "kubelet")
        self._wait(f"Node {self.name} Ready", self.kubelet.node_ready, timeout=timeout)

    def stop(self) -> None:
        """Stop the kubelet (its pods stay as they are: the VM goes down next) and remove the Node
        from the control plane, so the DaemonSet's pod there and its CSINode go with it."""
        if self.vm.running():
            self.vm.run("pkill -x kubelet; pkill -x containerd; true", timeout=60)
        with self.plane.api_client() as client:
            try:
                kubernetes.client.CoreV1Api(client).delete_node(self.name)
            except kubernetes.client.ApiException as error:
                if error.status != 404:
                    raise

    def logs(self, lines: int = 40) -> str:
        parts = []
        for name in ("kubelet", "containerd"):
            tail = self.vm.read_file(f"{name}.log").splitlines()[-lines:]
            parts.append(f"--- guest {name}.log (last {lines} lines)\n" + "\n".join(tail))
        return "\n".join(parts)

    def _put(self, path: Path, text: str, mode: str = "0644") -> None:
        """Write a file in the guest (through the control share)."""
        name = "put-" + str(path).strip("/").replace("/", "_")
        with open(self.vm.host_path(name), "w", encoding="utf-8") as handle:
            handle.write(text)
        self.vm.check(f"install -D -m {mode} {shlex.quote(self.vm.guest_path(name))} {shlex.quote(str(path))} && "
                      f"rm -f {shlex.quote(self.vm.guest_path(name))}", timeout=60)

    def _wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        budget = scaled(timeout)
        deadline = time.monotonic() + budget
        while not check():
            if time.monotonic() > deadline:
                raise VmError(f"VM {self.vm.index}: {what}: not within {budget:.0f}s\n{self.logs()}")
            time.sleep(1)
