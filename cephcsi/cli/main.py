"""`cephcsi` entry point: settings → logging → services → sidecars → wait for a signal."""
from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType

import grpc

from cephcsi import __version__
from cephcsi._generated import csi_pb2_grpc
from cephcsi.cli.args import fail, parse_settings
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.csi.identity import IdentityOptions, IdentityServicer
from cephcsi.csi.server import CSIServer
from cephcsi.errors import CephCSIError
from cephcsi.observability import logging as cephcsi_logging
from cephcsi.observability.logging import fields
from cephcsi.settings import Settings

log = logging.getLogger("cephcsi")


def _servers(settings: Settings, clusters: ClusterRegistry) -> list[CSIServer]:
    identity = IdentityServicer(
        IdentityOptions(
            driver_name=settings.driver_name,
            controller=settings.serves_controller,
            topology=settings.serves_node and bool(settings.node.domain_labels),
        )
    )
    main: list[Callable[[grpc.Server], None]] = [lambda s: csi_pb2_grpc.add_IdentityServicer_to_server(identity, s)]
    controller_side: list[Callable[[grpc.Server], None]] = []
    if settings.serves_controller:
        from cephcsi.csi.controller import ControllerServicer

        controller = ControllerServicer.from_settings(settings, clusters)
        register = lambda s: csi_pb2_grpc.add_ControllerServicer_to_server(controller, s)  # noqa: E731
        (controller_side if settings.controller_endpoint else main).append(register)
    if settings.serves_node:
        from cephcsi.csi.node import NodeServicer

        node = NodeServicer.from_settings(settings, clusters)
        main.append(lambda s: csi_pb2_grpc.add_NodeServicer_to_server(node, s))
    servers = [CSIServer(settings.endpoint, settings.grpc_workers, main)]
    if controller_side:
        controller_side.insert(0, lambda s: csi_pb2_grpc.add_IdentityServicer_to_server(identity, s))
        servers.append(CSIServer(settings.controller_endpoint, settings.grpc_workers, controller_side))
    return servers


def run(settings: Settings) -> int:
    clusters = ClusterRegistry(settings.config_file)
    servers = _servers(settings, clusters)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, shutting down", extra=fields(signal=signal.Signals(signum).name))
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for server in servers:
        server.start()
    log.info(
        "cephcsi started",
        extra=fields(version=__version__, mode=settings.mode, driver=settings.driver_name, clusters=clusters.ids()),
    )
    stop.wait()
    for server in servers:
        server.stop(settings.shutdown_grace)
    log.info("cephcsi stopped")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_settings(argv)
    cephcsi_logging.configure(settings.log_level, settings.log_json)
    try:
        return run(settings)
    except CephCSIError as error:
        fail(str(error))


if __name__ == "__main__":
    raise SystemExit(main())
