"""CSI Node service: validates requests, translates protobuf ↔ cephcsi.node domain calls.

Order of checks matters to COs and csi-sanity: required fields first (INVALID_ARGUMENT naming
the field), then the volume id (an id this driver never issues is NOT_FOUND: the volume does
not exist), then the volume context and secrets. All storage logic lives in cephcsi.node.
"""
from __future__ import annotations

import re

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.ceph.credentials import Credentials
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.csi.capabilities import DEFAULT_FS_TYPE, READ_ONLY_MODES, Mode, check_well_formed, unsupported_reason
from cephcsi.csi.rpc import ServicerBase, rpc
from cephcsi.encryption import spec as encryption_spec
from cephcsi.errors import InvalidArgument, NotFound
from cephcsi.node.expander import NodeExpandRequest
from cephcsi.node.paths import check_path, check_volume_id, nested
from cephcsi.node.requests import PublishRequest, StageRequest, VolumeAccess
from cephcsi.node.service import NodeService
from cephcsi.node import ownership, volume_source
from cephcsi.node.stage_record import ACCESS_BLOCK, ACCESS_MOUNT, ImageSpec
from cephcsi.settings import Settings
from cephcsi.volumes.volume_id import VolumeId

_Rpc = csi_pb2.NodeServiceCapability.RPC
NODE_CAPABILITIES = (
    _Rpc.STAGE_UNSTAGE_VOLUME, _Rpc.GET_VOLUME_STATS, _Rpc.VOLUME_CONDITION, _Rpc.SINGLE_NODE_MULTI_WRITER, _Rpc.EXPAND_VOLUME
)
_MOUNT_FLAG = re.compile(r"^[A-Za-z0-9_.:/+=@-]+$")
# Flags that would change what kind of mount we make rather than how it behaves.
_FORBIDDEN_FLAGS = {"bind", "rbind", "remount", "move", "make-shared", "make-private"}

# volume_context keys (StorageClass parameters passed through by the controller)
CTX_CLUSTER_ID = "clusterID"
CTX_POOL = "pool"
CTX_IMAGE = "imageName"
CTX_NAMESPACE = "radosNamespace"
CTX_MOUNTER = "mounter"
CTX_MAP_OPTIONS = "mapOptions"
CTX_UNMAP_OPTIONS = "unmapOptions"
CTX_MKFS_OPTIONS = "mkfsOptions"


class NodeServicer(ServicerBase, csi_pb2_grpc.NodeServicer):
    service_name = "Node"

    def __init__(self, service: NodeService, clusters: ClusterRegistry, settings: Settings) -> None:
        self.service = service
        self.clusters = clusters
        self.settings = settings
        self.driver_name = settings.driver_name
        self.slow_call_seconds = settings.slow_call_seconds
        self.kubelet_dir = settings.node.kubelet_dir

    # -- staging -----------------------------------------------------------------------------

    @rpc
    def NodeStageVolume(self, request: csi_pb2.NodeStageVolumeRequest, context: object) -> csi_pb2.NodeStageVolumeResponse:
        volume_id = check_volume_id(request.volume_id)
        staging = check_path(request.staging_target_path, "staging_target_path", self.kubelet_dir)
        access = _access(request, "volume_capability")
        ctx = request.volume_context
        # A provisioned volume (id of ours) or a static one (the id is the image name).
        source = volume_source.resolve(volume_id, ctx)
        cluster_id = source.cluster_id
        cluster = self.clusters.get(cluster_id)
        namespace = source.namespace if source.namespace is not None else cluster.rados_namespace
        # from_secrets refuses a malformed key: the rbd tools would echo it into their logs.
        credentials = Credentials.from_secrets(request.secrets)
        encryption = encryption_spec.from_volume_context(ctx)  # INVALID_ARGUMENT on a bad value
        self.service.stage(
            StageRequest(
                volume_id=volume_id,
                staging_path=staging,
                cluster_id=cluster_id,
                monitors=cluster.mon_host,
                image=ImageSpec(pool=source.pool, image=source.image, namespace=namespace),
                credentials=credentials,
                access=access,
                mounter=ctx.get(CTX_MOUNTER, ""),
                map_options=ctx.get(CTX_MAP_OPTIONS, ""),
                unmap_options=ctx.get(CTX_UNMAP_OPTIONS, ""),
                mkfs_options=ctx.get(CTX_MKFS_OPTIONS, ""),
                read_affinity=cluster.read_affinity,
                encryption=encryption,
                secrets=dict(request.secrets) if encryption is not None else {},
            )
        )
        return csi_pb2.NodeStageVolumeResponse()

    @rpc
    def NodeUnstageVolume(
        self, request: csi_pb2.NodeUnstageVolumeRequest, context: object
    ) -> csi_pb2.NodeUnstageVolumeResponse:
        volume_id = check_volume_id(request.volume_id)
        staging = check_path(request.staging_target_path, "staging_target_path", self.kubelet_dir)
        # No id decoding: unstage must clean up whatever the path holds for this id, and an
        # unknown id on an empty path is simply nothing to do.
        self.service.unstage(volume_id, staging)
        return csi_pb2.NodeUnstageVolumeResponse()

    # -- publishing --------------------------------------------------------------------------

    @rpc
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: object
    ) -> csi_pb2.NodePublishVolumeResponse:
        volume_id = check_volume_id(request.volume_id)
        target = check_path(request.target_path, "target_path", self.kubelet_dir)
        staging = check_path(request.staging_target_path, "staging_target_path", self.kubelet_dir)
        access = _access(request, "volume_capability")
        if nested(target, staging):
            raise InvalidArgument(f"target_path {target} and staging_target_path {staging} must not contain each other")
        volume_source.check_known(volume_id, request.volume_context)
        # The node-publish secret is not checked here: only a krbd volume's QoS step reads a
        # cephx user from it, and a secret it cannot use must not fail any other publish.
        self.service.publish(
            PublishRequest(
                volume_id=volume_id, staging_path=staging, target_path=target, access=access, read_only=request.readonly,
                secrets=dict(request.secrets), cluster_monitors=self._monitors,
            )
        )
        return csi_pb2.NodePublishVolumeResponse()

    def _monitors(self, cluster_id: str) -> str:
        return self.clusters.get(cluster_id).mon_host

    @rpc
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: object
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        volume_id = check_volume_id(request.volume_id)
        target = check_path(request.target_path, "target_path", self.kubelet_dir)
        self.service.unpublish(volume_id, target)
        return csi_pb2.NodeUnpublishVolumeResponse()

    # -- information -------------------------------------------------------------------------

    @rpc
    def NodeGetVolumeStats(
        self, request: csi_pb2.NodeGetVolumeStatsRequest, context: object
    ) -> csi_pb2.NodeGetVolumeStatsResponse:
        volume_id = check_volume_id(request.volume_id)
        if not request.volume_path:
            raise InvalidArgument("volume_path is required")
        if not volume_source.plausible_id(volume_id):
            _decode(volume_id)  # NOT_FOUND with the reason
        try:
            path = check_path(request.volume_path, "volume_path", self.kubelet_dir)
        except InvalidArgument as error:
            # A path we would never have staged or published to holds no volume of ours.
            raise NotFound(f"no volume {volume_id} at {request.volume_path}: {error.message}") from None
        if not volume_source.is_issued(volume_id) and volume_id not in ownership.volume_ids_at(path):
            # A static volume's id has no form to check: the path must show it is staged there.
            raise NotFound(f"volume {volume_id!r} does not exist at {request.volume_path} (no stage of it found there)")
        result = self.service.volume_stats(volume_id, path)
        response = csi_pb2.NodeGetVolumeStatsResponse(
            volume_condition=csi_pb2.VolumeCondition(abnormal=result.abnormal, message=result.message)
        )
        Unit = csi_pb2.VolumeUsage.Unit
        if result.total_bytes is not None:
            response.usage.append(
                csi_pb2.VolumeUsage(
                    unit=Unit.BYTES,
                    total=result.total_bytes,
                    used=result.used_bytes or 0,
                    available=result.available_bytes or 0,
                )
            )
        if result.total_inodes is not None:
            response.usage.append(
                csi_pb2.VolumeUsage(
                    unit=Unit.INODES,
                    total=result.total_inodes,
                    used=result.used_inodes or 0,
                    available=result.available_inodes or 0,
                )
            )
        return response

    @rpc
    def NodeExpandVolume(self, request: csi_pb2.NodeExpandVolumeRequest, context: object) -> csi_pb2.NodeExpandVolumeResponse:
        volume_id = check_volume_id(request.volume_id)
        if not request.volume_path:
            raise InvalidArgument("volume_path is required")
        if not volume_source.plausible_id(volume_id):
            _decode(volume_id)  # NOT_FOUND with the reason
        try:
            path = check_path(request.volume_path, "volume_path", self.kubelet_dir)
        except InvalidArgument as error:
            # A path we would never have staged or published to holds no volume of ours.
            raise NotFound(f"no volume {volume_id} at {request.volume_path}: {error.message}") from None
        staging = ""
        if request.staging_target_path:
            staging = check_path(request.staging_target_path, "staging_target_path", self.kubelet_dir)
        access_type = ""
        if request.HasField("volume_capability"):
            check_well_formed(request.volume_capability, "volume_capability")
            access_type = ACCESS_BLOCK if request.volume_capability.HasField("block") else ACCESS_MOUNT
        size = self.service.expand(
            NodeExpandRequest(
                volume_id=volume_id,
                volume_path=path,
                staging_path=staging,
                required_bytes=max(0, request.capacity_range.required_bytes),
                limit_bytes=max(0, request.capacity_range.limit_bytes),
                access_type=access_type,
            )
        )
        return csi_pb2.NodeExpandVolumeResponse(capacity_bytes=size)

    @rpc
    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: object
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse(
            capabilities=[csi_pb2.NodeServiceCapability(rpc=_Rpc(type=kind)) for kind in NODE_CAPABILITIES]
        )

    @rpc
    def NodeGetInfo(self, request: csi_pb2.NodeGetInfoRequest, context: object) -> csi_pb2.NodeGetInfoResponse:
        response = csi_pb2.NodeGetInfoResponse(
            node_id=self.settings.node.node_id, max_volumes_per_node=max(0, self.settings.node.max_volumes_per_node)
        )
        segments = self.service.topology()
        if segments:
            response.accessible_topology.CopyFrom(csi_pb2.Topology(segments=segments))
        return response


def _decode(volume_id: str) -> VolumeId:
    return volume_source.decode(volume_id)


def _access(
    request: csi_pb2.NodeStageVolumeRequest | csi_pb2.NodePublishVolumeRequest, field: str
) -> VolumeAccess:
    if not request.HasField("volume_capability"):
        raise InvalidArgument(f"{field} is required")
    capability = request.volume_capability
    check_well_formed(capability, field)
    reason = unsupported_reason(capability)
    if reason:
        raise InvalidArgument(f"{field}: {reason}")
    mode = capability.access_mode.mode
    read_only = mode in READ_ONLY_MODES
    single_writer = mode == Mode.SINGLE_NODE_SINGLE_WRITER
    if capability.HasField("block"):
        return VolumeAccess(ACCESS_BLOCK, read_only=read_only, single_writer=single_writer)
    flags = tuple(capability.mount.mount_flags)
    for flag in flags:
        if not _MOUNT_FLAG.match(flag) or flag in _FORBIDDEN_FLAGS:
            raise InvalidArgument(f"{field}.mount.mount_flags: {flag!r} is not an allowed mount option")
    return VolumeAccess(
        ACCESS_MOUNT,
        fs_type=capability.mount.fs_type or DEFAULT_FS_TYPE,
        mount_flags=flags,
        read_only=read_only,
        single_writer=single_writer,
    )
