"""gRPC server on a unix socket, with graceful shutdown that removes the socket. At most
`max_workers` non-Identity calls run at once, the rest refused at once with RESOURCE_EXHAUSTED;
Identity calls have threads of their own. Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from cephcsi.errors import ConfigError, ResourceExhausted, status_of
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

# Threads only Identity calls (Probe, GetPluginInfo, GetPluginCapabilities) can hold. They answer
# from memory in microseconds, so a few cover any probe rate; more than one so a burst of
# kubelet, registrar and livenessprobe calls does not even queue.
IDENTITY_THREADS = 4
UNGATED_PREFIX = "/csi.v1.Identity/"


class AdmissionGate(grpc.ServerInterceptor):
    """Lets at most `limit` non-Identity calls run at once; refuses the others at once."""

    def __init__(self, limit: int, endpoint: str) -> None:
        self.limit = limit
        self.endpoint = endpoint
        self._slots = threading.BoundedSemaphore(limit)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        method = str(details.method)
        if handler is None or handler.unary_unary is None or method.startswith(UNGATED_PREFIX):
            return handler
        return grpc.unary_unary_rpc_method_handler(
            self._gated(method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _gated(self, method: str, behaviour: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def gated(request: Any, context: grpc.ServicerContext) -> Any:
            # Taken on the pool thread, not at dispatch: a call cancelled before it starts
            # then never holds a slot it would not give back.
            if not self._slots.acquire(blocking=False):
                self._refuse(method, context)
            try:
                return behaviour(request, context)
            finally:
                self._slots.release()

        return gated

    def _refuse(self, method: str, context: grpc.ServicerContext) -> None:
        error = ResourceExhausted(
            f"the driver on {self.endpoint} is busy: {self.limit} calls are already running "
            f"(--grpc-workers); {method.rsplit('/', 1)[-1]} was not started, retry later"
        )
        log.warning("call refused: all workers busy", extra=fields(method=method, limit=self.limit))
        code, message = status_of(error)
        context.abort(code, message)


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
            futures.ThreadPoolExecutor(max_workers=self.max_workers + IDENTITY_THREADS, thread_name_prefix="csi"),
            interceptors=[AdmissionGate(self.max_workers, self.path)],
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
        log.info("serving", extra=fields(endpoint=self.path, workers=self.max_workers, identity_threads=IDENTITY_THREADS))

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
