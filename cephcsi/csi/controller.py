"""CSI Controller service: protobuf in, VolumeManager calls, protobuf out."""
from __future__ import annotations

import logging

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.ceph.credentials import Credentials
from cephcsi.csi.capabilities import SINGLE_NODE_MODES, check_well_formed, require_supported, unsupported_reason
from cephcsi.csi.capacity import CapacityRpcs
from cephcsi.csi.rpc import ServicerBase, rpc
from cephcsi.csi.snapshots import SnapshotRpcs, content_source, content_source_message
from cephcsi.errors import InvalidArgument, NotFound, Unimplemented
from cephcsi.observability.logging import fields
from cephcsi.volumes import expansion
from cephcsi.volumes import metadata as image_owner
from cephcsi.volumes import modify
from cephcsi.volumes.capacity import choose_size
from cephcsi.volumes.manager import CreateRequest, VolumeManager
from cephcsi.volumes.parameters import VolumeParameters
from cephcsi.volumes.publish import LocalNodes, NodeDirectory, Publisher, check_node_id
from cephcsi.volumes.snapshots import SnapshotManager
from cephcsi.volumes.topology import Requirements

log = logging.getLogger(__name__)

_RPC = csi_pb2.ControllerServiceCapability.RPC
STATIC_VOLUME = "staticVolume"
CAPABILITIES = (_RPC.CREATE_DELETE_VOLUME, _RPC.SINGLE_NODE_MULTI_WRITER, _RPC.EXPAND_VOLUME,
                _RPC.CREATE_DELETE_SNAPSHOT, _RPC.LIST_SNAPSHOTS, _RPC.CLONE_VOLUME, _RPC.GET_CAPACITY,
                _RPC.MODIFY_VOLUME)
PUBLISH_CAPABILITIES = (_RPC.PUBLISH_UNPUBLISH_VOLUME,)
"""With a Publisher: ControllerPublish records the node holding the volume and refuses a second
writer node; ControllerUnpublish fences a node out of service (cephcsi.volumes.publish)."""
MAX_NAME_LENGTH = 255


def requirements_of(request: csi_pb2.CreateVolumeRequest) -> Requirements | None:
    """The request's accessibility requirements, None when the CO sent none."""
    if not request.HasField("accessibility_requirements"):
        return None
    wanted = request.accessibility_requirements
    return Requirements(preferred=tuple(dict(t.segments) for t in wanted.preferred),
                        requisite=tuple(dict(t.segments) for t in wanted.requisite))


class ControllerServicer(SnapshotRpcs, CapacityRpcs, ServicerBase, csi_pb2_grpc.ControllerServicer):
    service_name = "Controller"

    def __init__(self, volumes: VolumeManager, driver_name: str, slow_call_seconds: float = 10.0,
                 snapshots: SnapshotManager | None = None, publisher: Publisher | None = None,
                 nodes: NodeDirectory | None = None) -> None:
        self.volumes = volumes
        self.driver_name = driver_name
        self.slow_call_seconds = slow_call_seconds
        self.snapshots = snapshots
        self.publisher = publisher
        self.nodes: NodeDirectory = nodes or LocalNodes()
        """Replaced by the sidecar wiring with the Kubernetes view (Nodes, CSINodes, taints)."""

    @rpc
    def CreateVolume(self, request: csi_pb2.CreateVolumeRequest, context: object) -> csi_pb2.CreateVolumeResponse:
        if not request.name:
            raise InvalidArgument("name is required (the CO's unique name for the volume, e.g. pvc-<uid>)")
        if len(request.name) > MAX_NAME_LENGTH:
            raise InvalidArgument(f"name is longer than {MAX_NAME_LENGTH} characters")
        require_supported(request.volume_capabilities)
        source = content_source(request)
        if source is not None and self.volumes.cloner is None:
            raise InvalidArgument("volume_content_source: snapshots and clones are not enabled in this driver")
        params = VolumeParameters.parse(request.parameters)
        qos_policy = modify.create_policy(request.parameters, request.mutable_parameters)
        required, limit = request.capacity_range.required_bytes, request.capacity_range.limit_bytes
        size = choose_size(required, limit)
        volume = self.volumes.create(
            CreateRequest(
                name=request.name,
                parameters=params,
                size=size,
                required_bytes=required,
                limit_bytes=limit,
                credentials=Credentials.from_secrets(request.secrets),
                metadata=image_owner.from_parameters(request.parameters),
                source=source,
                secrets=request.secrets,
                requirements=requirements_of(request),
            )
        )
        if not qos_policy.empty or source is not None:
            # After the image exists, so a retried CreateVolume (the CO retries until it gets an
            # answer) sets what a crash here left unset; a clone also drops its source's limits.
            modify.apply(self.volumes, volume.volume_id.encode(), qos_policy, Credentials.from_secrets(request.secrets))
        return csi_pb2.CreateVolumeResponse(
            volume=csi_pb2.Volume(
                volume_id=volume.volume_id.encode(), capacity_bytes=volume.size, volume_context=volume.context,
                content_source=content_source_message(source),
                accessible_topology=[csi_pb2.Topology(segments=volume.topology)] if volume.topology is not None else [],
            )
        )

    @rpc
    def DeleteVolume(self, request: csi_pb2.DeleteVolumeRequest, context: object) -> csi_pb2.DeleteVolumeResponse:
        if not request.volume_id:
            raise InvalidArgument("volume_id is required")
        self.volumes.delete(request.volume_id, request.secrets)
        return csi_pb2.DeleteVolumeResponse()

    def find_volume(self, name: str, parameters: VolumeParameters, credentials: Credentials) -> str | None:
        """The provisioner's port (cephcsi.sidecars.provisioner.port): the volume of request `name`."""
        return self.volumes.find(name, parameters, credentials)

    @rpc
    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: object
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        if not request.volume_id:
            raise InvalidArgument("volume_id is required")
        if not request.volume_capabilities:
            raise InvalidArgument("volume_capabilities must name at least one capability")
        for index, capability in enumerate(request.volume_capabilities):
            check_well_formed(capability, f"volume_capabilities[{index}]")
        self.volumes.locate(request.volume_id, Credentials.from_secrets(request.secrets))
        for capability in request.volume_capabilities:
            reason = unsupported_reason(capability)
            if reason:
                return csi_pb2.ValidateVolumeCapabilitiesResponse(message=reason)
        return csi_pb2.ValidateVolumeCapabilitiesResponse(
            confirmed=csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
                volume_context=request.volume_context,
                volume_capabilities=request.volume_capabilities,
                parameters=request.parameters,
                mutable_parameters=request.mutable_parameters,
            )
        )

    @rpc
    def ControllerExpandVolume(
        self, request: csi_pb2.ControllerExpandVolumeRequest, context: object
    ) -> csi_pb2.ControllerExpandVolumeResponse:
        if not request.volume_id:
            raise InvalidArgument("volume_id is required")
        if not request.HasField("capacity_range"):
            raise InvalidArgument("capacity_range is required (required_bytes: the new size of the volume)")
        block = False
        if request.HasField("volume_capability"):
            check_well_formed(request.volume_capability, "volume_capability")
            block = request.volume_capability.HasField("block")
        result = expansion.expand(
            self.volumes,
            expansion.ExpandRequest(
                volume_id=request.volume_id,
                required_bytes=request.capacity_range.required_bytes,
                limit_bytes=request.capacity_range.limit_bytes,
                credentials=Credentials.from_secrets(request.secrets),
            ),
        )
        # A filesystem must be grown where it is mounted; krbd and rbd-nbd devices follow the
        # image by themselves, so a Block volume needs no node step, unless it is encrypted: its
        # LUKS mapping must grow on the node (`cryptsetup resize`), as ceph-csi answers too.
        return csi_pb2.ControllerExpandVolumeResponse(capacity_bytes=result.size,
                                                      node_expansion_required=not block or result.encrypted)

    @rpc
    def ControllerModifyVolume(
        self, request: csi_pb2.ControllerModifyVolumeRequest, context: object
    ) -> csi_pb2.ControllerModifyVolumeResponse:
        if not request.volume_id:
            raise InvalidArgument("volume_id is required")
        modify.modify(self.volumes, request.volume_id, request.mutable_parameters,
                      Credentials.from_secrets(request.secrets))
        return csi_pb2.ControllerModifyVolumeResponse()

    @rpc
    def ControllerPublishVolume(
        self, request: csi_pb2.ControllerPublishVolumeRequest, context: object
    ) -> csi_pb2.ControllerPublishVolumeResponse:
        publisher = self._publisher()
        if not request.volume_id:
            raise InvalidArgument("volume_id is required")
        check_node_id(request.node_id)
        if not request.HasField("volume_capability"):
            raise InvalidArgument("volume_capability is required")
        require_supported([request.volume_capability], "volume_capability")
        if request.volume_context.get(STATIC_VOLUME) == "true" or not request.secrets:
            # ceph-csi's pre-provisioned volumes (volumeHandle = the image name) and PVs whose class
            # names no controller-publish secret (ceph-csi's own older PVs; the embedded attacher
            # falls back to the provisioner's or node-stage secret) are published without a record.
            log.warning("volume published without a record: no exclusivity check and no fencing for it", extra=fields(
                volume=request.volume_id, node=request.node_id,
                reason="static volume" if request.secrets else "no controller-publish secret"))
            return csi_pb2.ControllerPublishVolumeResponse()
        credentials = Credentials.from_secrets(request.secrets)
        if self.nodes.exists(request.node_id) is False:
            raise NotFound(f"node {request.node_id!r} is not known: no node runs this driver's node plugin with that id")
        single_node = request.volume_capability.access_mode.mode in SINGLE_NODE_MODES
        publisher.publish(request.volume_id, request.node_id, single_node, credentials)
        return csi_pb2.ControllerPublishVolumeResponse()

    @rpc
    def ControllerUnpublishVolume(
        self, request: csi_pb2.ControllerUnpublishVolumeRequest, context: object
    ) -> csi_pb2.ControllerUnpublishVolumeResponse:
        publisher = self._publisher()
        if not request.volume_id:
            raise InvalidArgument("volume_id is required")
        if not request.node_id:
            # The spec allows "from every node"; Kubernetes always names one, and fencing needs it.
            raise InvalidArgument("node_id is required (unpublishing from every node at once is not supported)")
        check_node_id(request.node_id)
        if not request.secrets:
            log.warning("volume unpublished without secrets: its record (if any) stays and no fencing is possible",
                        extra=fields(volume=request.volume_id, node=request.node_id))
            return csi_pb2.ControllerUnpublishVolumeResponse()
        fence = self.nodes.out_of_service(request.node_id)
        publisher.unpublish(request.volume_id, request.node_id, Credentials.from_secrets(request.secrets), fence)
        return csi_pb2.ControllerUnpublishVolumeResponse()

    def _publisher(self) -> Publisher:
        if self.publisher is None:
            raise Unimplemented("ControllerPublish/Unpublish are not enabled in this controller")
        return self.publisher

    @rpc
    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: object
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        return csi_pb2.ControllerGetCapabilitiesResponse(
            capabilities=[csi_pb2.ControllerServiceCapability(rpc=_RPC(type=t))
                          for t in CAPABILITIES + (PUBLISH_CAPABILITIES if self.publisher is not None else ())]
        )
