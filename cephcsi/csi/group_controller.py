"""CSI GroupController service: volume group snapshots (cephcsi.volumes.group_snapshots)."""
from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.ceph.credentials import Credentials
from cephcsi.csi.rpc import ServicerBase, rpc
from cephcsi.csi.snapshots import MAX_NAME_LENGTH, snapshot_message
from cephcsi.errors import InvalidArgument
from cephcsi.volumes.group_snapshots import GroupParameters, GroupSnapshot, GroupSnapshotManager, GroupSnapshotRequest

_RPC = csi_pb2.GroupControllerServiceCapability.RPC


def group_snapshot_message(group: GroupSnapshot) -> csi_pb2.VolumeGroupSnapshot:
    seconds = int(group.creation_time)
    created = Timestamp(seconds=seconds, nanos=round((group.creation_time - seconds) * 1e9))
    members = []
    for snapshot in group.snapshots:
        message = snapshot_message(snapshot)
        message.group_snapshot_id = group.group_snapshot_id
        members.append(message)
    return csi_pb2.VolumeGroupSnapshot(group_snapshot_id=group.group_snapshot_id, snapshots=members,
                                       creation_time=created, ready_to_use=group.ready)


class GroupControllerServicer(ServicerBase, csi_pb2_grpc.GroupControllerServicer):
    service_name = "GroupController"

    def __init__(self, groups: GroupSnapshotManager, driver_name: str, slow_call_seconds: float = 10.0) -> None:
        self.groups = groups
        self.driver_name = driver_name
        self.slow_call_seconds = slow_call_seconds

    @rpc
    def GroupControllerGetCapabilities(self, request: csi_pb2.GroupControllerGetCapabilitiesRequest,
                                       context: object) -> csi_pb2.GroupControllerGetCapabilitiesResponse:
        return csi_pb2.GroupControllerGetCapabilitiesResponse(capabilities=[
            csi_pb2.GroupControllerServiceCapability(rpc=_RPC(type=_RPC.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT))])

    @rpc
    def CreateVolumeGroupSnapshot(self, request: csi_pb2.CreateVolumeGroupSnapshotRequest,
                                  context: object) -> csi_pb2.CreateVolumeGroupSnapshotResponse:
        if not request.name:
            raise InvalidArgument("name is required (the CO's unique name for the group snapshot, e.g. groupsnapshot-<uid>)")
        if len(request.name) > MAX_NAME_LENGTH:
            raise InvalidArgument(f"name is longer than {MAX_NAME_LENGTH} characters")
        if not request.source_volume_ids:
            raise InvalidArgument("source_volume_ids is required (the volumes to snapshot together)")
        group = self.groups.create(GroupSnapshotRequest(
            name=request.name,
            source_volume_ids=list(request.source_volume_ids),
            parameters=GroupParameters.parse(request.parameters),
            credentials=Credentials.from_secrets(request.secrets),
        ))
        return csi_pb2.CreateVolumeGroupSnapshotResponse(group_snapshot=group_snapshot_message(group))

    @rpc
    def DeleteVolumeGroupSnapshot(self, request: csi_pb2.DeleteVolumeGroupSnapshotRequest,
                                  context: object) -> csi_pb2.DeleteVolumeGroupSnapshotResponse:
        if not request.group_snapshot_id:
            raise InvalidArgument("group_snapshot_id is required")
        self.groups.delete(request.group_snapshot_id, list(request.snapshot_ids), request.secrets)
        return csi_pb2.DeleteVolumeGroupSnapshotResponse()

    @rpc
    def GetVolumeGroupSnapshot(self, request: csi_pb2.GetVolumeGroupSnapshotRequest,
                               context: object) -> csi_pb2.GetVolumeGroupSnapshotResponse:
        if not request.group_snapshot_id:
            raise InvalidArgument("group_snapshot_id is required")
        group = self.groups.get(request.group_snapshot_id, list(request.snapshot_ids),
                                Credentials.from_secrets(request.secrets))
        return csi_pb2.GetVolumeGroupSnapshotResponse(group_snapshot=group_snapshot_message(group))
