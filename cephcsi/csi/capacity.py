"""GetCapacity: the bytes a StorageClass's pool (its data pool when named) can still take; 0 for a
request without parameters. Credentials come from the class's provisioner secret through a
`CapacitySecrets` source (none installed: FAILED_PRECONDITION). Mixed into ControllerServicer.
Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from cephcsi._generated import csi_pb2
from cephcsi.ceph import pool_capacity
from cephcsi.ceph.connection import Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.csi.capabilities import unsupported_reason
from cephcsi.csi.rpc import ServicerBase, rpc
from cephcsi.errors import FailedPrecondition, InvalidArgument, NotFound
from cephcsi.observability.logging import fields
from cephcsi.volumes import placement
from cephcsi.volumes.manager import VolumeManager
from cephcsi.volumes.parameters import VolumeParameters

log = logging.getLogger(__name__)

Mode = csi_pb2.VolumeCapability.AccessMode


class CapacitySecrets(Protocol):
    """Where GetCapacity's credentials come from, given the request's (StorageClass) parameters."""

    def credentials_for(self, parameters: Mapping[str, str]) -> Credentials: ...


class NoCapacitySecrets:
    """The default: no way to read the Secret a StorageClass names."""

    def credentials_for(self, parameters: Mapping[str, str]) -> Credentials:
        raise FailedPrecondition(
            "GetCapacity needs cephx credentials, which its request cannot carry: the controller reads the "
            "StorageClass's provisioner secret (csi.storage.k8s.io/provisioner-secret-name/-namespace) through the "
            "Kubernetes API, which needs the embedded sidecars (--sidecars with provisioner, and a kubeconfig)"
        )


class CapacityRpcs(ServicerBase):
    """Needs `self.volumes` (the clusters and the connection cache)."""

    volumes: VolumeManager
    capacity_secrets: CapacitySecrets = NoCapacitySecrets()
    """Replaced by the sidecar wiring with the Kubernetes Secret reader."""

    @rpc
    def GetCapacity(self, request: csi_pb2.GetCapacityRequest, context: object) -> csi_pb2.GetCapacityResponse:
        if not request.parameters:
            return csi_pb2.GetCapacityResponse(available_capacity=0)
        if not _capabilities_possible(request.volume_capabilities):
            return csi_pb2.GetCapacityResponse(available_capacity=0)
        parsed = VolumeParameters.parse(request.parameters)
        # A class with topologyConstrainedPools: the pool of the segment asked about.
        segments = dict(request.accessible_topology.segments) if request.HasField("accessible_topology") else None
        params = placement.for_segment(parsed, segments)
        if params is None:
            return csi_pb2.GetCapacityResponse(available_capacity=0)
        try:
            cluster = self.volumes.clusters.get(params.cluster_id)
        except NotFound as error:
            raise InvalidArgument(f"parameter clusterID: {error.message}") from None
        credentials = self.capacity_secrets.credentials_for(request.parameters)
        timeout = self.volumes.connections.settings.mon_op_timeout
        with self.volumes.connections.session(cluster, credentials) as session:
            data = _read(session, params.data_pool or params.pool, "dataPool" if params.data_pool else "pool", timeout)
            available = data.available
            if params.data_pool and available:
                images = _read(session, params.pool, "pool", timeout)
                if images.objects_exhausted or images.quota_room == 0:
                    log.info("image pool quota used up: no volume can be created", extra=fields(pool=params.pool))
                    available = 0
        return csi_pb2.GetCapacityResponse(available_capacity=available)


def _read(session: Session, pool: str, parameter: str, timeout: float) -> pool_capacity.PoolCapacity:
    try:
        return pool_capacity.read(session.rados, pool, timeout)
    except NotFound as error:
        raise InvalidArgument(f"parameter {parameter}: {error.message}") from None


def _capabilities_possible(capabilities: Sequence[csi_pb2.VolumeCapability]) -> bool:
    """False when no volume could be created with every capability given (capacity 0 then).

    A capability without an access mode is skipped: external-provisioner before v3 sent one
    (mount, mode UNKNOWN) on every call, meaning "any"."""
    for capability in capabilities:
        if capability.WhichOneof("access_type") is None:
            raise InvalidArgument("volume_capabilities: access_type must be set to block or mount")
        if capability.access_mode.mode == Mode.UNKNOWN:
            continue
        if unsupported_reason(capability) is not None:
            return False
    return True
