"""Starts the embedded sidecar loops chosen with --sidecars and stops them in order.

Controller mode: provisioner and attacher run only while this replica holds the Lease
(informers run everywhere so a standby's caches are warm). Node mode: the registrar.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from cephcsi.csi.server import socket_path
from cephcsi.observability.health import HealthRegistry
from cephcsi.settings import Settings
from cephcsi.sidecars.registrar import Registrar, RegistrarOptions

if TYPE_CHECKING:
    from cephcsi.csi.services import Services

log = logging.getLogger(__name__)

RequestExit = Callable[[int, str], None]


class Loop(Protocol):
    def stop(self) -> None: ...


class SidecarRunner:
    def __init__(self) -> None:
        self._loops: list[Loop] = []

    def add(self, loop: Loop) -> None:
        self._loops.append(loop)

    def stop(self) -> None:
        for loop in reversed(self._loops):
            try:
                loop.stop()
            except Exception:  # noqa: BLE001 - keep stopping the others
                log.exception("stopping a sidecar loop failed")


def registrar_options(settings: Settings) -> RegistrarOptions:
    kubelet_dir = settings.node.kubelet_dir or "/var/lib/kubelet"
    csi_endpoint = settings.sidecars.kubelet_registration_path or os.path.join(
        kubelet_dir, "plugins", settings.driver_name, "csi.sock"
    )
    return RegistrarOptions(
        driver_name=settings.driver_name,
        csi_endpoint=socket_path(csi_endpoint),
        registry_dir=os.path.join(kubelet_dir, "plugins_registry"),
    )


def start_sidecars(settings: Settings, services: Services, health: HealthRegistry, request_exit: RequestExit) -> SidecarRunner:
    runner = SidecarRunner()
    enabled = set(settings.sidecars.enabled)
    if "registrar" in enabled:
        registrar = Registrar(registrar_options(settings))
        registrar.start()
        health.add_liveness("registrar", registrar.health)
        runner.add(registrar)
    controller_loops = enabled & {"provisioner", "attacher", "resizer", "snapshotter"}
    if controller_loops:
        from cephcsi.sidecars.controller import start_controller_loops

        runner.add(start_controller_loops(settings, services, health, request_exit, controller_loops))
    return runner
