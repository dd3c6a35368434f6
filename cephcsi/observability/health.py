"""Health and readiness checks served on the HTTP endpoint.

/healthz is what the livenessprobe sidecar would do, done in-process: it dials the CSI socket
and calls Probe, so a wedged gRPC server (not just a live process) fails the check; loops
such as leader election add their own checks. /readyz reports whether the process is ready to
do its job (informer caches synced). Each check returns None when healthy or a reason.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from cephcsi._generated import csi_pb2, csi_pb2_grpc

Check = Callable[[], "str | None"]


@dataclass
class HealthRegistry:
    liveness: dict[str, Check] = field(default_factory=dict)
    readiness: dict[str, Check] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_liveness(self, name: str, check: Check) -> None:
        with self._lock:
            self.liveness[name] = check

    def add_readiness(self, name: str, check: Check) -> None:
        with self._lock:
            self.readiness[name] = check

    def remove(self, name: str) -> None:
        with self._lock:
            self.liveness.pop(name, None)
            self.readiness.pop(name, None)

    def run(self, kind: str) -> dict[str, str | None]:
        with self._lock:
            checks = dict(self.liveness if kind == "liveness" else self.readiness)
        results: dict[str, str | None] = {}
        for name, check in checks.items():
            try:
                results[name] = check()
            except Exception as error:  # noqa: BLE001 - a failing check is a result, not a crash
                results[name] = f"check failed: {error}"
        return results


class SocketProbe:
    """Calls Identity.Probe on the driver's own socket with a short deadline."""

    def __init__(self, endpoint: str, timeout: float = 3.0) -> None:
        self.endpoint = endpoint if endpoint.startswith("unix:") else f"unix://{endpoint}"
        self.timeout = timeout
        self._channel: grpc.Channel | None = None

    def __call__(self) -> str | None:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.endpoint)
        try:
            response = csi_pb2_grpc.IdentityStub(self._channel).Probe(csi_pb2.ProbeRequest(), timeout=self.timeout)
        except grpc.RpcError as error:
            return f"CSI Probe on {self.endpoint} failed: {error.code().name}"
        if response.HasField("ready") and not response.ready.value:
            return "CSI Probe says not ready"
        return None

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
