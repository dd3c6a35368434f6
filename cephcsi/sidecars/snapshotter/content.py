"""One VolumeSnapshotContent of this driver → CreateSnapshot / ListSnapshots / DeleteSnapshot, as
csi-snapshotter (v8) does it; failures set status.error and a Warning event. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from cephcsi._generated import csi_pb2
from cephcsi.csi.controller import ControllerServicer
from cephcsi.errors import CephCSIError, InvalidArgument, OperationInFlight
from cephcsi.kube.events import NORMAL, WARNING, EventRecorder
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import objects
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.snapshotter.api import SnapshotApi

log = logging.getLogger(__name__)

PREFIX = "snapshot.storage.kubernetes.io/"
BEING_CREATED = PREFIX + "volumesnapshot-being-created"
BEING_DELETED = PREFIX + "volumesnapshot-being-deleted"
DELETION_SECRET_NAME = PREFIX + "deletion-secret-name"
DELETION_SECRET_NAMESPACE = PREFIX + "deletion-secret-namespace"
BOUND_FINALIZER = PREFIX + "volumesnapshotcontent-bound-protection"
RESERVED = "csi.storage.k8s.io/"
SECRET_NAME, SECRET_NAMESPACE = RESERVED + "snapshotter-secret-name", RESERVED + "snapshotter-secret-namespace"
LIST_SECRET_NAME, LIST_SECRET_NAMESPACE = RESERVED + "snapshotter-list-secret-name", RESERVED + "snapshotter-list-secret-namespace"
META_NAME, META_NAMESPACE = RESERVED + "volumesnapshot/name", RESERVED + "volumesnapshot/namespace"
META_CONTENT = RESERVED + "volumesnapshotcontent/name"
# The snapshot-controller's mark on the VolumeSnapshotContents it makes for the members of a
# VolumeGroupSnapshot: their snapshot was cut by CreateVolumeGroupSnapshot and goes with it.
GROUP_HANDLE_ANNOTATION = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle"
# csi-snapshotter's isCSIFinalError: everything else means "retrying cannot help".
NOT_FINAL = {grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE,
             grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED}

Request = TypeVar("Request")
Response = TypeVar("Response")


class NotReady(OperationInFlight):
    """The snapshot is cut but not ready to use yet (a flatten pending): asked again later."""


@dataclass
class SnapshotterContext:
    driver_name: str
    contents: Any
    """Informer of VolumeSnapshotContents (cached dicts)."""
    snapshots: SnapshotApi
    api: KubeApi
    events: EventRecorder
    controller: ControllerServicer
    calls: CsiCalls
    extra_create_metadata: bool = False


def ours(content: Mapping[str, Any], driver_name: str) -> bool:
    return objects.spec(content).get("driver") == driver_name


def only_own_bookkeeping(old: Mapping[str, Any], new: Mapping[str, Any], being_created: str = BEING_CREATED) -> bool:
    """Whether an update changed nothing but what the worker itself writes around a failed
    attempt: the being-created annotation (set before each CreateSnapshot, dropped after a final
    error) and status.error. Such an event must not re-queue the content: the queue's `add`
    bypasses the rate limiter, so every failing attempt would start the next at once (about ten
    a second) instead of after the item's backoff."""
    def significant(content: Mapping[str, Any]) -> tuple[Any, ...]:
        meta = dict(objects.meta(content))
        annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != being_created}
        for key in ("resourceVersion", "managedFields", "annotations", "generation"):
            meta.pop(key, None)
        status = {k: v for k, v in (content.get("status") or {}).items() if k != "error"}
        rest = {k: v for k, v in content.items() if k not in ("metadata", "status")}
        return (meta, annotations, status, rest)
    return significant(old) == significant(new)


def group_member(content: Mapping[str, Any]) -> bool:
    """csi-snapshotter's test for a member of a group snapshot: never CreateSnapshot (the group
    cut it) and never DeleteSnapshot (DeleteVolumeGroupSnapshot removes it)."""
    return (GROUP_HANDLE_ANNOTATION in objects.annotations_of(content)
            or bool((content.get("status") or {}).get("volumeGroupSnapshotHandle")))


def should_delete(content: Mapping[str, Any]) -> bool:
    """csi-snapshotter's shouldDelete: an unbound pre-provisioned content at once; otherwise only
    once the snapshot-controller asked (being-deleted) and no CreateSnapshot is still unanswered
    (being-created: the snapshot may exist without the content knowing its handle)."""
    if not objects.deleting(content):
        return False
    spec = objects.spec(content)
    unbound = not (spec.get("volumeSnapshotRef") or {}).get("uid")
    if (spec.get("source") or {}).get("snapshotHandle") and unbound:
        return True
    annotations = objects.annotations_of(content)
    return BEING_CREATED not in annotations and BEING_DELETED in annotations


def resolve_template(text: str, content: Mapping[str, Any]) -> str:
    ref = objects.spec(content).get("volumeSnapshotRef") or {}
    for key, value in (("${volumesnapshotcontent.name}", objects.name(content)),
                       ("${volumesnapshot.namespace}", str(ref.get("namespace") or "")),
                       ("${volumesnapshot.name}", str(ref.get("name") or ""))):
        text = text.replace(key, value)
    if "${" in text:
        raise InvalidArgument(f"secret reference {text!r} has an unknown template (supported: ${{volumesnapshotcontent.name}}, "
                              "${volumesnapshot.namespace}, ${volumesnapshot.name})")
    return text


def snapshot_name(content: Mapping[str, Any]) -> str:
    uid = str((objects.spec(content).get("volumeSnapshotRef") or {}).get("uid") or "")
    if not uid:
        raise InvalidArgument("spec.volumeSnapshotRef.uid is empty: the content is not bound to a VolumeSnapshot yet")
    return f"snapshot-{uid}"


def create_parameters(class_parameters: Mapping[str, str], content: Mapping[str, Any], extra: bool) -> dict[str, str]:
    parameters = {k: v for k, v in class_parameters.items() if not k.startswith(RESERVED)}
    if extra:
        ref = objects.spec(content).get("volumeSnapshotRef") or {}
        parameters.update({META_NAME: str(ref.get("name") or ""), META_NAMESPACE: str(ref.get("namespace") or ""),
                           META_CONTENT: objects.name(content)})
    return parameters


def status_of(snapshot: csi_pb2.Snapshot) -> dict[str, Any]:
    created = snapshot.creation_time.seconds * 1_000_000_000 + snapshot.creation_time.nanos
    return {"snapshotHandle": snapshot.snapshot_id, "creationTime": created, "restoreSize": snapshot.size_bytes,
            "readyToUse": snapshot.ready_to_use, "error": None}


def error_status(message: str, now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.timezone.utc)) -> dict[str, Any]:
    return {"error": {"time": now().strftime("%Y-%m-%dT%H:%M:%SZ"), "message": message}}


class ContentWorker:
    """Also the base of the group snapshotter's worker (`cephcsi.sidecars.groupsnapshotter.content`),
    which shares the bookkeeping below under its own annotation and finalizer names."""

    being_created = BEING_CREATED
    bound_finalizer = BOUND_FINALIZER
    deletion_secret = (DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE)
    class_field = "volumeSnapshotClassName"
    class_kind, class_resource = "VolumeSnapshotClass", "volumesnapshotclass.snapshot.storage.k8s.io"

    def __init__(self, ctx: SnapshotterContext, stop: threading.Event) -> None:
        self.ctx = ctx
        self.stop = stop

    def process(self, name: str) -> None:
        with request_scope():
            content = self.ctx.contents.get(name)
            if content is None or not ours(content, self.ctx.driver_name):
                return
            if objects.deleting(content):
                if should_delete(content):
                    self.delete(content)
                elif BEING_CREATED in objects.annotations_of(content):
                    self._answer_then_delete(content)
                return
            status = content.get("status") or {}
            if status.get("readyToUse"):
                return
            source = objects.spec(content).get("source") or {}
            if group_member(content):
                # The snapshot-controller writes the member's status from its group's; until
                # then there is nothing to ask. Readiness comes as for a pre-provisioned one,
                # with the group's secret (the deletion-secret annotations: a member has no class).
                if status.get("snapshotHandle"):
                    self.import_existing(content, str(status["snapshotHandle"]))
            elif source.get("volumeHandle"):
                self.create(content)
            elif source.get("snapshotHandle"):
                self.import_existing(content, str(source["snapshotHandle"]))

    def _answer_then_delete(self, content: KubeObject) -> None:
        """A deleted content whose CreateSnapshot was never answered (a timeout, a crash): ask
        again (idempotent by name) as csi-snapshotter does, so the snapshot gets its handle and
        is then deleted in this pass instead of leaking or the content staying for ever."""
        if (content.get("status") or {}).get("readyToUse") or self._answered(content):
            # Left by a crash between the status write and the annotation's removal: the handle
            # is known, so the deletion needs no new answer (and no class or secret to ask with).
            latest = self.ctx.snapshots.patch_content(objects.name(content),
                                                      {"metadata": {"annotations": {BEING_CREATED: None}}})
        elif (objects.spec(content).get("source") or {}).get("volumeHandle") and not group_member(content):
            latest = self.create(content)
        else:
            return
        if latest is not None and should_delete(latest):
            # From the object the last write returned: that write (dropping being-created) is own
            # bookkeeping whose watch event re-queues nothing.
            self.delete(latest)

    # ---- dynamic ---------------------------------------------------------------------------

    def create(self, content: KubeObject) -> KubeObject | None:
        """CreateSnapshot; the content as the last write returned it."""
        name = objects.name(content)

        def request() -> csi_pb2.CreateSnapshotRequest:
            class_parameters = self._class_parameters(content)
            return csi_pb2.CreateSnapshotRequest(
                name=snapshot_name(content),
                source_volume_id=str(objects.spec(content)["source"]["volumeHandle"]),
                parameters=create_parameters(class_parameters, content, self.ctx.extra_create_metadata),
                secrets=self._secrets(content, class_parameters, (SECRET_NAME, SECRET_NAMESPACE)),
            )
        response = self._ask_create(content, "SnapshotCreationFailed", "CreateSnapshot", request,
                                    lambda r: r.name, lambda r: self.ctx.controller.CreateSnapshot(r, None))
        snapshot = response.snapshot
        self.ctx.snapshots.patch_content_status(name, status_of(snapshot))
        # Answered: the handle is in the status, so a deletion no longer needs to wait (as
        # csi-snapshotter, which drops the annotation after any successful answer). Waiting for
        # readiness too would hold a deleted content until a flatten finished, or for ever.
        latest: KubeObject | None = content
        if BEING_CREATED in objects.annotations_of(content) or not self._answered(content):
            # Set by this call's _ask_create or an earlier one; not written again per readiness check.
            latest = self.ctx.snapshots.patch_content(name, {"metadata": {"annotations": {BEING_CREATED: None}}})
        if not snapshot.ready_to_use:
            raise NotReady(f"snapshot {snapshot.snapshot_id} of VolumeSnapshotContent {name} is not ready to use yet "
                           "(its clone chain is being flattened); checking again")
        self.ctx.events.event(content, NORMAL, "SnapshotCreated", f"Created snapshot {snapshot.snapshot_id}")
        log.info("snapshot created", extra=fields(content=name, snapshot=snapshot.snapshot_id))
        return latest

    # ---- pre-provisioned ---------------------------------------------------------------------

    def import_existing(self, content: KubeObject, handle: str) -> None:
        name = objects.name(content)
        try:
            class_parameters = self._class_parameters(content, required=False)
            keys = (LIST_SECRET_NAME, LIST_SECRET_NAMESPACE) if LIST_SECRET_NAME in class_parameters else (SECRET_NAME, SECRET_NAMESPACE)
            secret_values = self._secrets(content, class_parameters, keys)
            request = csi_pb2.ListSnapshotsRequest(snapshot_id=handle, secrets=secret_values)
            listed = self.ctx.calls.run("ListSnapshots", handle, lambda: self.ctx.controller.ListSnapshots(request, None),
                                        self.stop)
            if not listed.entries:
                raise InvalidArgument(f"snapshot {handle!r} named by spec.source.snapshotHandle does not exist")
        except CephCSIError as error:
            self._failed(content, "SnapshotContentCheckandUpdateFailed", error, final=False)
            raise
        snapshot = listed.entries[0].snapshot
        self.ctx.snapshots.patch_content_status(name, status_of(snapshot))
        if not snapshot.ready_to_use:
            raise NotReady(f"pre-provisioned snapshot {handle} is not ready to use yet; checking again")

    # ---- deletion ----------------------------------------------------------------------------

    def delete(self, content: KubeObject) -> None:
        self._no_create_running(content)
        name = objects.name(content)
        spec = objects.spec(content)
        handle = str((content.get("status") or {}).get("snapshotHandle") or (spec.get("source") or {}).get("snapshotHandle") or "")
        if spec.get("deletionPolicy") == "Delete" and handle and not group_member(content):
            try:
                secret_values = self._deletion_secrets(content)
                request = csi_pb2.DeleteSnapshotRequest(snapshot_id=handle, secrets=secret_values)
                self.ctx.calls.run("DeleteSnapshot", handle, lambda: self.ctx.controller.DeleteSnapshot(request, None), self.stop)
            except CephCSIError as error:
                self._failed(content, "SnapshotDeleteError", error, final=False)
                raise
            cleared = self.ctx.snapshots.patch_content_status(name, {"snapshotHandle": None, "readyToUse": False})
            log.info("snapshot deleted", extra=fields(content=name, snapshot=handle))
            # That write gave the content a new resourceVersion: the finalizer patch must name
            # it, or it always conflicts and the content waits one backoff for nothing.
            content = cleared or content
        self._remove_finalizer(content)

    def _remove_finalizer(self, content: KubeObject) -> None:
        if not objects.has_finalizer(content, self.bound_finalizer):
            return
        remaining = [f for f in objects.finalizers(content) if f != self.bound_finalizer]
        # A JSON merge patch replaces the whole list; the resourceVersion makes a concurrent
        # change of the list a conflict (retried with the fresh object) instead of a lost finalizer.
        rv = objects.meta(content).get("resourceVersion")
        self.ctx.snapshots.patch_content(objects.name(content), {"metadata": {"finalizers": remaining, "resourceVersion": rv}})

    # ---- helpers -----------------------------------------------------------------------------

    def _class_parameters(self, content: KubeObject, required: bool = True) -> dict[str, str]:
        kind = self.class_kind
        class_name = str(objects.spec(content).get(self.class_field) or "")
        if not class_name:
            if required:
                raise InvalidArgument(f"spec.{self.class_field} is empty; a dynamic snapshot needs a {kind}")
            return {}
        found = self.ctx.snapshots.get_class(class_name)
        if found is None:
            raise InvalidArgument(f'{self.class_resource} "{class_name}" not found')
        if found.get("driver") != self.ctx.driver_name:
            raise InvalidArgument(f"{kind} {class_name} is for driver {found.get('driver')!r}, not {self.ctx.driver_name!r}")
        return {str(k): str(v) for k, v in (found.get("parameters") or {}).items()}

    def _secrets(self, content: KubeObject, parameters: Mapping[str, str], keys: tuple[str, str]) -> dict[str, str]:
        name_template, namespace_template = parameters.get(keys[0], ""), parameters.get(keys[1], "")
        if not name_template and not namespace_template:
            return self._deletion_secrets(content)
        if not (name_template and namespace_template):
            raise InvalidArgument(f"VolumeSnapshotClass parameters {keys[0]} and {keys[1]} must be set together")
        return self.ctx.api.read_secret(self._resolve(namespace_template, content), self._resolve(name_template, content))

    @staticmethod
    def _resolve(text: str, content: Mapping[str, Any]) -> str:
        return resolve_template(text, content)

    def _deletion_secrets(self, content: KubeObject) -> dict[str, str]:
        annotations = objects.annotations_of(content)
        name, namespace = annotations.get(self.deletion_secret[0], ""), annotations.get(self.deletion_secret[1], "")
        return self.ctx.api.read_secret(namespace, name) if name and namespace else {}

    def _ask_create(self, content: KubeObject, reason: str, method: str, build: Callable[[], Request],
                    name_of: Callable[[Request], str], send: Callable[[Request], Response]) -> Response:
        """The create call with the being-created bookkeeping of csi-snapshotter (v8.7): the
        annotation is set once the request is built and before it is sent, and only a final
        answer of the driver to that call drops it. A request that cannot be built (class,
        binding or secret gone) is no answer: an earlier attempt may have been cut and never
        answered, and dropping the annotation then would let a deleting content go without its
        Delete call, leaking the snapshot in Ceph. It is recorded and retried with backoff."""
        try:
            request = build()
        except CephCSIError as error:
            self._failed(content, reason, error, final=False)
            raise
        if self.being_created not in objects.annotations_of(content) and not self._answered(content):
            self.ctx.snapshots.patch_content(objects.name(content), {"metadata": {"annotations": {self.being_created: "yes"}}})
        try:
            return self.ctx.calls.run(method, name_of(request), lambda: send(request), self.stop)
        except CephCSIError as error:
            self._failed(content, reason, error, final=error.code not in NOT_FINAL)
            raise

    handle_field = "snapshotHandle"
    create_name = staticmethod(snapshot_name)

    def _no_create_running(self, content: KubeObject) -> None:
        """A create call that timed out still runs in the background; deleting under it could
        remove the snapshot just before that call re-reserves the name and cuts a new one, which
        nothing would then delete. The deletion waits for it (OperationInFlight, requeued)."""
        try:
            name = self.create_name(content)
        except InvalidArgument:
            return  # never bound: nothing was ever asked under a name
        if self.ctx.calls.busy(name):
            raise OperationInFlight(f"a create call for {name} is still running; the deletion of "
                                    f"{objects.name(content)} waits for it")

    def _answered(self, content: KubeObject) -> bool:
        """An earlier call was answered (its handle is in the status): asking again, until the
        snapshot is ready, cannot leave one the content does not know."""
        return bool((content.get("status") or {}).get(self.handle_field))

    def _failed(self, content: KubeObject, reason: str, error: CephCSIError, final: bool) -> None:
        """Event and status.error; `final` (a final answer of the create call only) also drops
        the being-created annotation, which _ask_create set before the call even when the
        cached `content` predates it."""
        if isinstance(error, NotReady):
            return
        name = objects.name(content)
        self.ctx.events.event(content, WARNING, reason, error.message)
        recorded = ((content.get("status") or {}).get("error") or {}).get("message")
        if recorded != error.message:
            # As csi-snapshotter: the same error is not written again. Only its time would
            # change, and the watch event of that write re-queues the content at once, around
            # the backoff.
            self.ctx.snapshots.patch_content_status(name, error_status(error.message))
        if final:
            self.ctx.snapshots.patch_content(name, {"metadata": {"annotations": {self.being_created: None}}})
