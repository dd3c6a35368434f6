"""gRPC server on a unix socket, with graceful shutdown that removes the socket."""
from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc

from cephcsi.errors import ConfigError
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


def socket_path(endpoint: str) -> str:
    """`unix:///csi/csi.sock`, `unix:/csi/csi.sock` or a bare absolute path → the file path."""
    path = endpoint
    for prefix in ("unix://", "unix:"):
        if path.startswith(prefix):
            path = path[len(prefix):]
            break
    if not path.startswith("/"):
        raise ConfigError(f"endpoint {endpoint!r} must be a unix socket path like unix:///csi/csi.sock")
    return os.path.normpath(path)


@dataclass
class CSIServer:
    endpoint: str
    max_workers: int
    register: list[Callable[[grpc.Server], None]]

    def __post_init__(self) -> None:
        self.path = socket_path(self.endpoint)
        self._server: grpc.Server | None = None

    def start(self) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        self._remove_stale_socket()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="csi"),
            options=[("grpc.so_reuseport", 0)],
        )
        for add in self.register:
            add(server)
        if server.add_insecure_port(f"unix://{self.path}") == 0:
            raise ConfigError(f"cannot listen on {self.path}")
        # Only the kubelet and sidecars (root) should talk to the driver.
        server.start()
        os.chmod(self.path, 0o660)
        self._server = server
        log.info("serving", extra=fields(endpoint=self.path, workers=self.max_workers))

    def _remove_stale_socket(self) -> None:
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"{self.path} exists and is not a socket; refusing to replace it")
        os.unlink(self.path)

    def stop(self, grace_seconds: float) -> None:
        """Stop accepting calls, let in-flight ones finish for `grace_seconds`, then cancel them."""
        if self._server is None:
            return
        self._server.stop(grace_seconds).wait()
        self._server = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        log.info("stopped", extra=fields(endpoint=self.path))

    def wait(self) -> None:
        if self._server is not None:
            self._server.wait_for_termination()
