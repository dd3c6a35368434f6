"""Controller RPCs for snapshots (CreateSnapshot, DeleteSnapshot, ListSnapshots) and the
protobuf side of CreateVolume's content source. Mixed into ControllerServicer."""
from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from cephcsi._generated import csi_pb2
from cephcsi.ceph.credentials import Credentials
from cephcsi.csi.rpc import ServicerBase, rpc
from cephcsi.errors import InvalidArgument
from cephcsi.volumes import snapshot_list
from cephcsi.volumes.clones import ContentSource
from cephcsi.volumes.snapshots import Snapshot, SnapshotManager, SnapshotParameters, SnapshotRequest

MAX_NAME_LENGTH = 255


def content_source(request: csi_pb2.CreateVolumeRequest) -> ContentSource | None:
    """The request's volume_content_source as a domain value (None when absent)."""
    if not request.HasField("volume_content_source"):
        return None
    source = request.volume_content_source
    kind = source.WhichOneof("type")
    if kind == "snapshot":
        if not source.snapshot.snapshot_id:
            raise InvalidArgument("volume_content_source.snapshot.snapshot_id is required")
        return ContentSource("snapshot", source.snapshot.snapshot_id)
    if kind == "volume":
        if not source.volume.volume_id:
            raise InvalidArgument("volume_content_source.volume.volume_id is required")
        return ContentSource("volume", source.volume.volume_id)
    raise InvalidArgument("volume_content_source must name a snapshot or a volume")


def content_source_message(source: ContentSource | None) -> csi_pb2.VolumeContentSource | None:
    if source is None:
        return None
    if source.kind == "snapshot":
        return csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=source.source_id))
    return csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=source.source_id))


def snapshot_message(snapshot: Snapshot) -> csi_pb2.Snapshot:
    seconds = int(snapshot.creation_time)
    created = Timestamp(seconds=seconds, nanos=round((snapshot.creation_time - seconds) * 1e9))
    return csi_pb2.Snapshot(
        snapshot_id=snapshot.snapshot_id,
        source_volume_id=snapshot.source_volume_id,
        size_bytes=snapshot.size,
        creation_time=created,
        ready_to_use=snapshot.ready,
    )


class SnapshotRpcs(ServicerBase):
    """Needs `self.snapshots` (None when snapshots are not wired: then nothing is advertised)."""

    snapshots: SnapshotManager | None = None

    def _manager(self) -> SnapshotManager:
        if self.snapshots is None:
            raise InvalidArgument("snapshots are not enabled in this driver")
        return self.snapshots

    @rpc
    def CreateSnapshot(self, request: csi_pb2.CreateSnapshotRequest, context: object) -> csi_pb2.CreateSnapshotResponse:
        if not request.name:
            raise InvalidArgument("name is required (the CO's unique name for the snapshot, e.g. snapshot-<uid>)")
        if len(request.name) > MAX_NAME_LENGTH:
            raise InvalidArgument(f"name is longer than {MAX_NAME_LENGTH} characters")
        if not request.source_volume_id:
            raise InvalidArgument("source_volume_id is required (the volume to snapshot)")
        snapshot = self._manager().create(SnapshotRequest(
            name=request.name,
            source_volume_id=request.source_volume_id,
            parameters=SnapshotParameters.parse(request.parameters),
            credentials=Credentials.from_secrets(request.secrets),
            secrets=request.secrets,
        ))
        return csi_pb2.CreateSnapshotResponse(snapshot=snapshot_message(snapshot))

    @rpc
    def DeleteSnapshot(self, request: csi_pb2.DeleteSnapshotRequest, context: object) -> csi_pb2.DeleteSnapshotResponse:
        if not request.snapshot_id:
            raise InvalidArgument("snapshot_id is required")
        self._manager().delete(request.snapshot_id, request.secrets)
        return csi_pb2.DeleteSnapshotResponse()

    @rpc
    def ListSnapshots(self, request: csi_pb2.ListSnapshotsRequest, context: object) -> csi_pb2.ListSnapshotsResponse:
        page = snapshot_list.list_snapshots(self._manager(), snapshot_list.ListRequest(
            snapshot_id=request.snapshot_id,
            source_volume_id=request.source_volume_id,
            max_entries=request.max_entries,
            starting_token=request.starting_token,
            credentials=Credentials.from_secrets(request.secrets) if request.secrets else None,
        ))
        return csi_pb2.ListSnapshotsResponse(
            entries=[csi_pb2.ListSnapshotsResponse.Entry(snapshot=snapshot_message(s)) for s in page.entries],
            next_token=page.next_token,
        )
