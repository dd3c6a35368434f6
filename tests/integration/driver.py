"""Start a real `cephcsi` process for integration tests and talk to it over its socket."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from cephcsi._generated import csi_pb2, csi_pb2_grpc


_CLIENT_ID = re.compile(r"client_id[\"=: ]+(\d+)")
_GONE_CLIENT_IDS: set[int] = set()
_STARTED: list[DriverProcess] = []  # a list: subclasses are dataclasses with eq, so unhashable


def driver_client_ids() -> set[int]:
    """Every Ceph client id a driver process of this test session logged at connect (its own
    and those of drivers already cleaned up): to tell the driver's watches from anyone else's."""
    return _GONE_CLIENT_IDS | {found for driver in list(_STARTED) for found in driver.client_ids()}


@dataclass
class DriverProcess:
    """One cephcsi process; `args` are extra flags. Logs go to `log_path`."""

    config_file: str
    mode: str = "controller"
    args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="csi-", dir="/tmp"))

    def __post_init__(self) -> None:
        _STARTED.append(self)
        self.socket = os.path.join(self.workdir, "csi.sock")
        self.log_path = os.path.join(self.workdir, "driver.log")
        self.process: subprocess.Popen[bytes] | None = None
        self._channel: grpc.Channel | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "cephcsi",
            f"--mode={self.mode}",
            f"--endpoint={self.endpoint}",
            f"--config-file={self.config_file}",
            "--sidecars=none",
            "--log-level=debug",
            *self.args,
        ]

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it to serve (start() waits)."""
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        return self.process

    def start(self, timeout: float = 30) -> DriverProcess:
        self.process = self.launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"cephcsi exited with {self.process.returncode}:\n{self.log()}")
            if os.path.exists(self.socket):
                try:
                    self.identity.Probe(csi_pb2.ProbeRequest(), timeout=2)
                    return self
                except grpc.RpcError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"cephcsi did not serve {self.socket} within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def client_ids(self) -> set[int]:
        """The Ceph client ids this process logged when it connected ("client.<id>" to Ceph)."""
        return {int(found) for found in _CLIENT_ID.findall(self.log())}

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.endpoint)
        return self._channel

    @property
    def identity(self) -> csi_pb2_grpc.IdentityStub:
        return csi_pb2_grpc.IdentityStub(self.channel)

    @property
    def controller(self) -> csi_pb2_grpc.ControllerStub:
        return csi_pb2_grpc.ControllerStub(self.channel)

    @property
    def node(self) -> csi_pb2_grpc.NodeStub:
        return csi_pb2_grpc.NodeStub(self.channel)

    def _close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def kill(self) -> None:
        """SIGKILL: the crash tests' way to stop the driver mid-operation."""
        self._close_channel()
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        self._close_channel()
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def cleanup(self) -> None:
        """Stop the process and remove its work dir — unless something is still mounted under
        it: removing files through a live rbd-fuse mount would delete the image itself."""
        self.stop()
        prefix = self.workdir.rstrip("/") + "/"
        with open("/proc/self/mountinfo", encoding="utf-8") as handle:
            mounted = [line.split()[4] for line in handle if line.split()[4].startswith(prefix)]
        if mounted:
            raise RuntimeError(f"not removing {self.workdir}: still mounted: {mounted}")
        _GONE_CLIENT_IDS.update(self.client_ids())  # its log goes with the work dir
        shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self) -> DriverProcess:
        self.kill()
        return self.start()
