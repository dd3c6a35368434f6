"""One VolumeGroupSnapshotContent of this driver → CreateVolumeGroupSnapshot /
GetVolumeGroupSnapshot / DeleteVolumeGroupSnapshot, as csi-snapshotter (v8.7) does it. The
bookkeeping (events, status.error, the being-created annotation, the bound finalizer, class and
secret lookups) is the snapshotter's, under the group's names. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.csi.group_controller import GroupControllerServicer
from cephcsi.errors import CephCSIError, InvalidArgument
from cephcsi.kube.events import NORMAL
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import objects
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.snapshotter.content import RESERVED, ContentWorker, NotReady, SnapshotterContext, ours

log = logging.getLogger(__name__)

PREFIX = "groupsnapshot.storage.kubernetes.io/"
BEING_CREATED = PREFIX + "volumegroupsnapshot-being-created"
BEING_DELETED = PREFIX + "volumegroupsnapshot-being-deleted"
DELETION_SECRET_NAME = PREFIX + "deletion-secret-name"
DELETION_SECRET_NAMESPACE = PREFIX + "deletion-secret-namespace"
BOUND_FINALIZER = PREFIX + "volumegroupsnapshotcontent-bound-protection"
SECRET_NAME, SECRET_NAMESPACE = RESERVED + "group-snapshotter-secret-name", RESERVED + "group-snapshotter-secret-namespace"
GET_SECRET_NAME = RESERVED + "group-snapshotter-get-secret-name"
GET_SECRET_NAMESPACE = RESERVED + "group-snapshotter-get-secret-namespace"
META_NAME, META_NAMESPACE = RESERVED + "volumegroupsnapshot/name", RESERVED + "volumegroupsnapshot/namespace"
META_CONTENT = RESERVED + "volumegroupsnapshotcontent/name"
# csi-snapshotter's --groupsnapshot-name-prefix default: the CSI name is <prefix>-<VolumeGroupSnapshot uid>.
NAME_PREFIX = "groupsnapshot"


@dataclass
class GroupSnapshotterContext(SnapshotterContext):
    """The snapshotter's context with `contents` the VolumeGroupSnapshotContent informer,
    `snapshots` a GroupSnapshotApi and the GroupController servicer called in-process."""

    groups: GroupControllerServicer | None = field(default=None, kw_only=True)


def ref_of(content: Mapping[str, Any]) -> Mapping[str, Any]:
    return objects.spec(content).get("volumeGroupSnapshotRef") or {}


def group_snapshot_name(content: Mapping[str, Any]) -> str:
    uid = str(ref_of(content).get("uid") or "")
    if not uid:
        raise InvalidArgument("spec.volumeGroupSnapshotRef.uid is empty: the content is not bound to a VolumeGroupSnapshot yet")
    return f"{NAME_PREFIX}-{uid}"


def should_delete(content: Mapping[str, Any]) -> bool:
    """csi-snapshotter's shouldDeleteGroupSnapshotContent: an unbound pre-provisioned content
    at once; otherwise only once the snapshot-controller asked (being-deleted) and no create is
    still unanswered (being-created: the group may exist without the content knowing it)."""
    if not objects.deleting(content):
        return False
    source = objects.spec(content).get("source") or {}
    if source.get("groupSnapshotHandles") and not ref_of(content).get("uid"):
        return True
    annotations = objects.annotations_of(content)
    return BEING_CREATED not in annotations and BEING_DELETED in annotations


def resolve_template(text: str, content: Mapping[str, Any]) -> str:
    ref = ref_of(content)
    for key, value in (("${volumegroupsnapshotcontent.name}", objects.name(content)),
                       ("${volumegroupsnapshot.namespace}", str(ref.get("namespace") or "")),
                       ("${volumegroupsnapshot.name}", str(ref.get("name") or ""))):
        text = text.replace(key, value)
    if "${" in text:
        raise InvalidArgument(f"secret reference {text!r} has an unknown template (supported: "
                              "${volumegroupsnapshotcontent.name}, ${volumegroupsnapshot.namespace}, "
                              "${volumegroupsnapshot.name})")
    return text


def create_parameters(class_parameters: Mapping[str, str], content: Mapping[str, Any], extra: bool) -> dict[str, str]:
    parameters = {k: v for k, v in class_parameters.items() if not k.startswith(RESERVED)}
    if extra:
        ref = ref_of(content)
        parameters.update({META_NAME: str(ref.get("name") or ""), META_NAMESPACE: str(ref.get("namespace") or ""),
                           META_CONTENT: objects.name(content)})
    return parameters


def rfc3339(timestamp: Any) -> str:
    """A protobuf Timestamp as metav1.Time writes it (seconds, UTC); the epoch (unset) is now,
    as csi-snapshotter substitutes a zero creation time."""
    seconds = int(timestamp.seconds) or int(datetime.datetime.now(datetime.timezone.utc).timestamp())
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_of(group: csi_pb2.VolumeGroupSnapshot, members: bool = True) -> dict[str, Any]:
    """The content's status from the driver's answer. `members` lists each member snapshot
    (volumeSnapshotInfoList), from which the snapshot-controller makes the member
    VolumeSnapshotContents and VolumeSnapshots; csi-snapshotter leaves it out for a
    pre-provisioned content."""
    status: dict[str, Any] = {"volumeGroupSnapshotHandle": group.group_snapshot_id, "readyToUse": group.ready_to_use,
                              "creationTime": rfc3339(group.creation_time)}
    if members:
        status["volumeSnapshotInfoList"] = [
            {"volumeHandle": s.source_volume_id, "snapshotHandle": s.snapshot_id,
             "creationTime": s.creation_time.seconds * 1_000_000_000 + s.creation_time.nanos,
             "readyToUse": s.ready_to_use, "restoreSize": s.size_bytes}
            for s in group.snapshots]
    if group.ready_to_use:
        status["error"] = None
    return status


def snapshot_ids(content: Mapping[str, Any]) -> list[str]:
    """The member snapshots a delete names: from the status (dynamic), else the spec (pre-provisioned)."""
    listed = [str(i.get("snapshotHandle") or "") for i in (content.get("status") or {}).get("volumeSnapshotInfoList") or []]
    if listed:
        return [i for i in listed if i]
    handles = (objects.spec(content).get("source") or {}).get("groupSnapshotHandles") or {}
    return [str(i) for i in handles.get("volumeSnapshotHandles") or []]


def group_handle(content: Mapping[str, Any]) -> str:
    status_handle = (content.get("status") or {}).get("volumeGroupSnapshotHandle")
    handles = (objects.spec(content).get("source") or {}).get("groupSnapshotHandles") or {}
    return str(status_handle or handles.get("volumeGroupSnapshotHandle") or "")


class GroupContentWorker(ContentWorker):
    being_created = BEING_CREATED
    bound_finalizer = BOUND_FINALIZER
    deletion_secret = (DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE)
    class_field = "volumeGroupSnapshotClassName"
    handle_field = "volumeGroupSnapshotHandle"
    create_name = staticmethod(group_snapshot_name)
    class_kind, class_resource = "VolumeGroupSnapshotClass", "volumegroupsnapshotclass.groupsnapshot.storage.k8s.io"

    def __init__(self, ctx: GroupSnapshotterContext, stop: threading.Event) -> None:
        super().__init__(ctx, stop)
        if ctx.groups is None:
            raise ValueError("the group snapshotter needs the GroupController servicer")
        self.groups: GroupControllerServicer = ctx.groups

    @staticmethod
    def _resolve(text: str, content: Mapping[str, Any]) -> str:
        return resolve_template(text, content)

    def process(self, name: str) -> None:
        with request_scope():
            content = self.ctx.contents.get(name)
            if content is None or not ours(content, self.ctx.driver_name):
                return
            deleting = objects.deleting(content)
            if deleting:
                if should_delete(content):
                    self.delete(content)
                    return
                if BEING_CREATED not in objects.annotations_of(content):
                    return
                # A create left unanswered (a timeout, a crash) holds the deletion back until it
                # is answered: asked again (idempotent by name) as csi-snapshotter does, so the
                # group is recorded and then deleted instead of the content staying for ever.
            latest = self._record(content)
            if deleting and latest is not None and should_delete(latest):
                # In this pass, from the objects the writes returned: the last write (dropping
                # being-created) is own bookkeeping whose watch event re-queues nothing, so
                # nothing else would come back to delete before the resync.
                self.delete(latest)

    def _record(self, content: KubeObject) -> KubeObject | None:
        """Create or import the group; the content as the last write returned it (None when
        nothing was written or the content is gone)."""
        name = objects.name(content)
        answered_and_deleting = objects.deleting(content) and self._answered(content)
        if (content.get("status") or {}).get("readyToUse") or answered_and_deleting:
            # A deleted content whose handle is known needs no new answer (nor the class or
            # secret to ask with) before its deletion, ready or not.
            if BEING_CREATED in objects.annotations_of(content):
                # Left by a crash between the status write and its removal.
                return self.ctx.snapshots.patch_content(name, {"metadata": {"annotations": {BEING_CREATED: None}}})
            return None
        source = objects.spec(content).get("source") or {}
        if source.get("groupSnapshotHandles"):
            self.import_group(content, source["groupSnapshotHandles"])
        elif source.get("volumeHandles"):
            return self.create(content)
        return None

    # ---- dynamic ---------------------------------------------------------------------------

    def create(self, content: KubeObject) -> KubeObject | None:
        """CreateVolumeGroupSnapshot; the content as the last write returned it."""
        name = objects.name(content)

        def request() -> csi_pb2.CreateVolumeGroupSnapshotRequest:
            class_parameters = self._class_parameters(content)
            return csi_pb2.CreateVolumeGroupSnapshotRequest(
                name=group_snapshot_name(content),
                source_volume_ids=[str(v) for v in objects.spec(content)["source"]["volumeHandles"]],
                parameters=create_parameters(class_parameters, content, self.ctx.extra_create_metadata),
                secrets=self._secrets(content, class_parameters, (SECRET_NAME, SECRET_NAMESPACE)),
            )
        response = self._ask_create(content, "GroupSnapshotCreationFailed", "CreateVolumeGroupSnapshot", request,
                                    lambda r: r.name, lambda r: self.groups.CreateVolumeGroupSnapshot(r, None))
        group = response.group_snapshot
        self.ctx.snapshots.patch_content_status(name, status_of(group))
        # The group is cut and recorded: whatever its readiness, nothing can leak any more.
        latest = self.ctx.snapshots.patch_content(name, {"metadata": {"annotations": {BEING_CREATED: None}}})
        if not group.ready_to_use:
            raise NotReady(f"group snapshot {group.group_snapshot_id} of VolumeGroupSnapshotContent {name} is not "
                           "ready to use yet; checking again")
        self.ctx.events.event(content, NORMAL, "GroupSnapshotCreated",
                              f"Created group snapshot {group.group_snapshot_id} of {len(group.snapshots)} volumes")
        log.info("group snapshot created", extra=fields(content=name, group_snapshot=group.group_snapshot_id,
                                                         members=len(group.snapshots)))
        return latest

    # ---- pre-provisioned ---------------------------------------------------------------------

    def import_group(self, content: KubeObject, handles: Mapping[str, Any]) -> None:
        name = objects.name(content)
        handle = str(handles.get("volumeGroupSnapshotHandle") or "")
        ids = [str(i) for i in handles.get("volumeSnapshotHandles") or []]
        try:
            class_parameters = self._class_parameters(content, required=False)
            keys = (GET_SECRET_NAME, GET_SECRET_NAMESPACE) if GET_SECRET_NAME in class_parameters else (SECRET_NAME, SECRET_NAMESPACE)
            request = csi_pb2.GetVolumeGroupSnapshotRequest(group_snapshot_id=handle, snapshot_ids=ids,
                                                            secrets=self._secrets(content, class_parameters, keys))
            got = self.ctx.calls.run("GetVolumeGroupSnapshot", handle,
                                     lambda: self.groups.GetVolumeGroupSnapshot(request, None), self.stop)
        except CephCSIError as error:
            self._failed(content, "GroupSnapshotContentCheckandUpdateFailed", error, final=False)
            raise
        group = got.group_snapshot
        self.ctx.snapshots.patch_content_status(name, status_of(group, members=False))
        if not group.ready_to_use:
            raise NotReady(f"pre-provisioned group snapshot {handle} is not ready to use yet; checking again")

    # ---- deletion ----------------------------------------------------------------------------

    def delete(self, content: KubeObject) -> None:
        self._no_create_running(content)
        name = objects.name(content)
        has_handle = bool((content.get("status") or {}).get("volumeGroupSnapshotHandle"))
        if objects.spec(content).get("deletionPolicy") == "Delete" and has_handle:
            handle, ids = group_handle(content), snapshot_ids(content)
            try:
                if not ids:
                    raise InvalidArgument(f"VolumeGroupSnapshotContent {name} lists no member snapshots "
                                          "(status.volumeSnapshotInfoList); DeleteVolumeGroupSnapshot needs them")
                request = csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=handle, snapshot_ids=ids,
                                                                   secrets=self._deletion_secrets(content))
                self.ctx.calls.run("DeleteVolumeGroupSnapshot", handle,
                                   lambda: self.groups.DeleteVolumeGroupSnapshot(request, None), self.stop)
            except CephCSIError as error:
                self._failed(content, "GroupSnapshotDeleteError", error, final=False)
                raise
            cleared = self.ctx.snapshots.patch_content_status(name, {
                "volumeGroupSnapshotHandle": None, "readyToUse": None, "creationTime": None, "error": None})
            log.info("group snapshot deleted", extra=fields(content=name, group_snapshot=handle, members=len(ids)))
            # The finalizer patch names the resourceVersion that write produced (see the snapshotter).
            content = cleared or content
        self._remove_finalizer(content)
