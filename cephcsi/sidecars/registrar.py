"""Kubelet plugin registration: the node-driver-registrar's job, in-process.

The kubelet's plugin watcher notices a socket appearing in `<kubelet-dir>/plugins_registry/`,
calls GetInfo to learn the driver's name and CSI endpoint, and reports the outcome with
NotifyRegistrationStatus. A failed registration is logged and turns /healthz red, so the
kubelet restarts the pod (the Go registrar exits instead; a restart is the same remedy).
"""
from __future__ import annotations

import logging
import os
import stat
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc

from cephcsi._generated import pluginregistration_pb2 as reg_pb2
from cephcsi._generated import pluginregistration_pb2_grpc as reg_grpc
from cephcsi.errors import ConfigError
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("1.0.0",)


@dataclass(frozen=True)
class RegistrarOptions:
    driver_name: str
    csi_endpoint: str
    """The CSI socket path as the kubelet sees it (host path)."""
    registry_dir: str
    """`<kubelet-dir>/plugins_registry`."""

    @property
    def socket_path(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver_name}-reg.sock")


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, options: RegistrarOptions) -> None:
        self.options = options
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:  # noqa: N802
        log.info("kubelet asked for plugin info", extra=fields(endpoint=self.options.csi_endpoint))
        return reg_pb2.PluginInfo(
            type="CSIPlugin",
            name=self.options.driver_name,
            endpoint=self.options.csi_endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self.error = ""
            self.registered.set()
            log.info("registered with the kubelet", extra=fields(driver=self.options.driver_name))
        else:
            self.registered.clear()
            self.error = request.error or "kubelet refused the registration without a reason"
            log.error("kubelet registration failed", extra=fields(error=self.error))
        return reg_pb2.RegistrationStatusResponse()


class Registrar:
    def __init__(self, options: RegistrarOptions) -> None:
        self.options = options
        self._servicer = _Registration(options)
        self._server: grpc.Server | None = None

    def start(self) -> None:
        path = self.options.socket_path
        os.makedirs(self.options.registry_dir, exist_ok=True)
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise ConfigError(f"{path} exists and is not a socket; refusing to replace it")
            os.unlink(path)  # a stale socket from a previous run would never be answered
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="registrar"))
        reg_grpc.add_RegistrationServicer_to_server(self._servicer, server)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise ConfigError(f"cannot listen on the kubelet registration socket {path}")
        server.start()
        self._server = server
        log.info("registration socket serving", extra=fields(socket=path, csi_endpoint=self.options.csi_endpoint))

    def health(self) -> str | None:
        """For /healthz: failing only when the kubelet told us registration failed."""
        if self._server is None:
            return "registrar not running"
        if self._servicer.error:
            return f"kubelet registration failed: {self._servicer.error}"
        if not os.path.exists(self.options.socket_path):
            return f"registration socket {self.options.socket_path} disappeared"
        return None

    @property
    def registered(self) -> bool:
        return self._servicer.registered.is_set()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(2).wait()
            self._server = None
        try:
            os.unlink(self.options.socket_path)
        except FileNotFoundError:
            pass
