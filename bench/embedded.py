"""Section 1's in-process side: CreateVolume/DeleteVolume called the way `cephcsi --mode=controller`
calls them for its embedded provisioner.

The embedded provisioner and the controller service live in one process, so the provisioner
calls the ControllerServicer's methods directly (`context=None`, cephcsi.csi.rpc): the request
goes through the same validation, logging, metrics and storage code as a gRPC call, but not
through gRPC. That is the path a claim takes in the shipped deployment; the gRPC side measures
what an external caller (a separate csi-provisioner, csi-sanity) pays on top. Here the servicer
is built by the driver's own wiring from the same flags as the bench's driver process and runs in
the bench process, so its CPU is measured like the raw side's: the process's own clock.
"""
from __future__ import annotations

import logging
from pathlib import Path

from cephcsi._generated import csi_pb2
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.cli.args import parse_settings
from cephcsi.cli.wiring import build_controller
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.observability.logging import TextFormatter

DRAIN_SECONDS = 10.0


class EmbeddedController:
    """The driver's controller service in this process; `call(...)` as the embedded provisioner does."""

    def __init__(self, config_file: str, driver_args: tuple[str, ...], log_path: Path) -> None:
        settings = parse_settings(["--mode=controller", f"--endpoint=unix://{log_path.parent}/unused.sock",
                                   f"--config-file={config_file}", "--sidecars=none", *driver_args])
        self.keeper = LeaseKeeper()
        self.servicer = build_controller(settings, ClusterRegistry(config_file), self.keeper)
        # The driver's log lines, written as its process writes them (a file, not the bench's
        # console): logging is part of what a call costs.
        self._handler = logging.FileHandler(log_path)
        self._handler.setFormatter(TextFormatter())
        self._logger = logging.getLogger("cephcsi")
        self._logger.addHandler(self._handler)
        self._logger.setLevel(logging.INFO)
        self._logger.propagate = False

    def create(self, request: csi_pb2.CreateVolumeRequest) -> str:
        return str(self.servicer.CreateVolume(request, None).volume.volume_id)

    def delete(self, request: csi_pb2.DeleteVolumeRequest) -> None:
        self.servicer.DeleteVolume(request, None)

    def close(self) -> None:
        self.keeper.drain(DRAIN_SECONDS)  # lease releases still running behind answers
        self._logger.removeHandler(self._handler)
        self._handler.close()
        self._logger.propagate = True
