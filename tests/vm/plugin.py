"""The node plugin as a process in a VM node, called over gRPC from the host.

`cephcsi --mode=node` runs from the working tree (shared read-only at the same path) with the
image's venv, as root, with udev running: what a privileged node-plugin container sees on a
real node. Its socket is relayed to TCP on the guest's address by forward.py (the plugin
serves unix sockets only), so the tests drive it with the generated stubs like every other
node test. Its log is a file in the VM's control share, readable from the host at any time.
"""
from __future__ import annotations

import json
import shlex
import time

import grpc

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from tests.ceph.fixtures import CephTestCluster
from tests.vm.machine import GUEST_VENV_PYTHON, VmError, VmNode, scaled

PORT = 10000
SOCKET = "/run/cephcsi/csi.sock"
KUBELET_DIR = "/var/lib/kubelet"
STATE_DIR = "/var/lib/cephcsi"
RUNTIME_DIR = "/run/cephcsi"
"""tmpfs state kept across plugin restarts (the rbd-nbd re-attach records)."""


class GuestPlugin:
    def __init__(self, vm: VmNode, cluster: CephTestCluster, extra_args: tuple[str, ...] = ()) -> None:
        self.vm = vm
        self.cluster = cluster
        self.extra_args = extra_args
        self.pid = 0
        self.forwarder_pid = 0
        self._channel: grpc.Channel | None = None
        self.starts = 0

    def command(self) -> str:
        argv = [
            GUEST_VENV_PYTHON, "-m", "cephcsi", "--mode=node", f"--endpoint=unix://{SOCKET}",
            f"--nodeid={self.vm.hostname}", f"--config-file={self.vm.guest_path('config.json')}",
            "--sidecars=none", "--log-level=debug", f"--kubelet-dir={KUBELET_DIR}", f"--state-dir={STATE_DIR}",
            f"--runtime-dir={RUNTIME_DIR}",
            "--mounter=auto", *self.extra_args,
        ]
        repo = shlex.quote(self.vm.repo)
        # No .pyc writes into the read-only share; the host's are used (same Python minor).
        return (f"mkdir -p /run/cephcsi {KUBELET_DIR} && cd {repo} && "
                f"exec env PYTHONPATH={repo} PYTHONDONTWRITEBYTECODE=1 {shlex.join(argv)}")

    def start(self, timeout: float = 180) -> None:
        config = [{"clusterID": self.cluster.cluster_id, "monitors": [self.cluster.mon_host],
                   "rbd": {"radosNamespace": ""}}]
        with open(self.vm.host_path("config.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        self.vm.check(f"rm -f {SOCKET}")
        self.starts += 1
        # Appended: a restart keeps the earlier run's log above the new one.
        self.pid = self.vm.spawn(f"{self.command()} >>{self.vm.guest_path('plugin.log')} 2>&1", f"plugin-{self.starts}")
        self._ensure_forwarder()
        budget = min(scaled(timeout), 300.0)  # within pytest's timeout even on a loaded host
        deadline = time.monotonic() + budget
        last = ""
        while time.monotonic() < deadline:
            alive = self.vm.run(f"kill -0 {self.pid}", timeout=30)
            if not alive.ok:
                raise VmError(f"the node plugin exited in the VM:\n{self.log()[-4000:]}")
            try:
                self.identity.Probe(csi_pb2.ProbeRequest(), timeout=5)
                return
            except grpc.RpcError as error:
                last = str(error.details())
                self._close()
            time.sleep(1)
        raise VmError(f"the node plugin did not answer within {budget:.0f}s ({last}):\n{self.log()[-4000:]}\n"
                      f"forwarder: {self.vm.read_file('forward.log')[-2000:]}")

    def _ensure_forwarder(self) -> None:
        if self.forwarder_pid and self.vm.run(f"kill -0 {self.forwarder_pid}", timeout=30).ok:
            return
        script = f"exec python3 {shlex.quote(self.vm.repo)}/tests/vm/forward.py {self.vm.address} {PORT} {SOCKET}"
        self.forwarder_pid = self.vm.spawn(script, "forward")

    def kill(self) -> None:
        """SIGKILL, as a crashed or OOM-killed plugin container."""
        self._close()
        self.vm.run(f"kill -9 {self.pid}; while kill -0 {self.pid} 2>/dev/null; do sleep 0.1; done", timeout=60)

    def stop(self) -> None:
        self._close()
        if self.pid:
            self.vm.run(f"kill -TERM {self.pid}; for i in $(seq 300); do kill -0 {self.pid} 2>/dev/null || exit 0; "
                        f"sleep 0.1; done; kill -9 {self.pid}", timeout=60)

    def restart(self) -> None:
        self.kill()
        self.start()

    def log(self) -> str:
        return self.vm.read_file("plugin.log")

    def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"{self.vm.address}:{PORT}")
        return self._channel

    @property
    def identity(self) -> csi_pb2_grpc.IdentityStub:
        return csi_pb2_grpc.IdentityStub(self.channel)

    @property
    def node(self) -> csi_pb2_grpc.NodeStub:
        return csi_pb2_grpc.NodeStub(self.channel)
