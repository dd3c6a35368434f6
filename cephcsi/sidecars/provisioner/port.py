"""The provisioner's port into the Controller service: the three calls it makes, so it depends on
them and not on how the controller keeps its volumes (cephcsi.csi.controller implements it; the
sidecar wiring passes that servicer in)."""
from __future__ import annotations

from typing import Protocol

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.volumes.parameters import VolumeParameters


class ControllerPort(Protocol):
    def CreateVolume(self, request: csi_pb2.CreateVolumeRequest, context: object  # noqa: N802
                     ) -> csi_pb2.CreateVolumeResponse: ...

    def DeleteVolume(self, request: csi_pb2.DeleteVolumeRequest, context: object  # noqa: N802
                     ) -> csi_pb2.DeleteVolumeResponse: ...

    def find_volume(self, name: str, parameters: VolumeParameters, credentials: Credentials) -> str | None:
        """The id of the volume created for request `name`, or None; creates nothing (a claim
        deleted before its PV existed leaves a volume only this finds)."""
        ...
