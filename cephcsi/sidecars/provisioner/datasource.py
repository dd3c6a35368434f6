"""Claims with a data source: restore from a VolumeSnapshot, clone a PersistentVolumeClaim
(external-provisioner's rules and messages; the source claim's cloning-protection finalizer).
Any other kind fails the claim. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cephcsi._generated import csi_pb2
from cephcsi.errors import InvalidArgument, OperationInFlight
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner import names
from cephcsi.sidecars.provisioner.request import PlannedVolume, quantity_bytes

if TYPE_CHECKING:
    from cephcsi.sidecars.provisioner.context import ProvisionerContext

log = logging.getLogger(__name__)

CLONE_FINALIZER = "provisioner.storage.kubernetes.io/cloning-protection"
SNAPSHOT_GROUP = "snapshot.storage.k8s.io"


def source_of(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    source = objects.spec(claim).get("dataSourceRef") or objects.spec(claim).get("dataSource")
    return source if isinstance(source, Mapping) and source else None


def unsupported(source: Mapping[str, Any]) -> str | None:
    """Why this data source cannot be provisioned here, or None."""
    kind, group = source.get("kind"), source.get("apiGroup") or ""
    if kind == "VolumeSnapshot" and group == SNAPSHOT_GROUP:
        return None
    if kind == "PersistentVolumeClaim" and group == "":
        return None
    return f"dataSource of kind {kind} (apiGroup {group or 'core'!r}) is not supported: use a VolumeSnapshot or a PersistentVolumeClaim"


def resolve(ctx: ProvisionerContext, claim: KubeObject, planned: PlannedVolume) -> csi_pb2.VolumeContentSource | None:
    """The CSI content source for the claim (protecting a source claim first), or None."""
    source = source_of(claim)
    if source is None:
        return None
    reason = unsupported(source)
    if reason:
        raise InvalidArgument(reason)
    if source.get("namespace") and source.get("namespace") != objects.namespace(claim):
        raise InvalidArgument("a dataSourceRef in another namespace is not supported")
    if source.get("kind") == "VolumeSnapshot":
        return _from_snapshot(ctx, claim, str(source.get("name") or ""), planned)
    return _from_claim(ctx, claim, str(source.get("name") or ""), planned)


def _from_snapshot(ctx: ProvisionerContext, claim: KubeObject, name: str, planned: PlannedVolume) -> csi_pb2.VolumeContentSource:
    namespace = objects.namespace(claim)
    if ctx.snapshots is None:
        raise InvalidArgument("restoring from a VolumeSnapshot needs the snapshot API (run the snapshotter loop)")
    snapshot = ctx.snapshots.get_snapshot(namespace, name)
    if snapshot is None:
        raise OperationInFlight(f'error getting snapshot {name} from api server: volumesnapshots "{name}" not found')
    if objects.deleting(snapshot):
        raise InvalidArgument(f"snapshot {namespace}/{name} is being deleted")
    status = snapshot.get("status") or {}
    if not status.get("readyToUse"):
        raise OperationInFlight(f"snapshot {namespace}/{name} is not Ready")
    content_name = str(status.get("boundVolumeSnapshotContentName") or "")
    content = ctx.snapshots.get_content(content_name) if content_name else None
    if content is None:
        raise OperationInFlight(f"snapshot {namespace}/{name} has no bound VolumeSnapshotContent yet")
    if objects.spec(content).get("driver") != ctx.driver_name:
        raise InvalidArgument(f"snapshot {namespace}/{name} belongs to driver {objects.spec(content).get('driver')!r}")
    ref = objects.spec(content).get("volumeSnapshotRef") or {}
    if ref.get("uid") and ref.get("uid") != objects.uid(snapshot):
        raise InvalidArgument(f"VolumeSnapshotContent {content_name} is bound to another VolumeSnapshot")
    handle = str((content.get("status") or {}).get("snapshotHandle") or "")
    if not handle:
        raise OperationInFlight(f"VolumeSnapshotContent {content_name} has no snapshot handle yet")
    restore = status.get("restoreSize")
    if restore is not None and quantity_bytes(restore, "status.restoreSize") > planned.required_bytes:
        raise InvalidArgument(f"requested volume size {planned.required_bytes} is less than the size "
                              f"{quantity_bytes(restore, 'status.restoreSize')} for the source snapshot {name}")
    return csi_pb2.VolumeContentSource(snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=handle))


def _from_claim(ctx: ProvisionerContext, claim: KubeObject, name: str, planned: PlannedVolume) -> csi_pb2.VolumeContentSource:
    namespace = objects.namespace(claim)
    source = ctx.claims.get(f"{namespace}/{name}")
    if source is None:
        raise OperationInFlight(f'error getting PVC {namespace}/{name}: persistentvolumeclaims "{name}" not found')
    if objects.deleting(source):
        raise InvalidArgument(f"the source PVC {name} is being deleted")
    if (source.get("status") or {}).get("phase") != "Bound" or not objects.spec(source).get("volumeName"):
        raise OperationInFlight(f"the source PVC {name} is not Bound")
    if objects.spec(source).get("storageClassName") != objects.spec(claim).get("storageClassName"):
        raise InvalidArgument(f"the source PVC and destination PVCs must be in the same storage class for cloning. "
                              f"Source is in {objects.spec(source).get('storageClassName')}, but new PVC is in "
                              f"{objects.spec(claim).get('storageClassName')}")
    pv = ctx.volumes.get(str(objects.spec(source)["volumeName"]))
    csi = objects.spec(pv).get("csi") or {} if pv is not None else {}
    if pv is None or csi.get("driver") != ctx.driver_name:
        raise InvalidArgument(f"the source PVC {name} is not provisioned by {ctx.driver_name}")
    capacity = ((source.get("status") or {}).get("capacity") or {}).get("storage")
    if capacity is not None and quantity_bytes(capacity, "source status.capacity.storage") > planned.required_bytes:
        raise InvalidArgument(f"error, new PVC request must be greater than or equal in size to the specified PVC "
                              f"data source, requested {planned.required_bytes} but source is {capacity}")
    if not objects.has_finalizer(source, CLONE_FINALIZER):
        ctx.api.add_pvc_finalizer(namespace, name, CLONE_FINALIZER)
    return csi_pb2.VolumeContentSource(volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=str(csi["volumeHandle"])))


def release_clone_protection(ctx: ProvisionerContext, source: KubeObject, finished_uid: str = "") -> None:
    """Remove the cloning finalizer from a source claim being deleted, unless a claim in its
    namespace is still being cloned from it (it holds the provisioning finalizer from before
    CreateVolume until its PV exists; `finished_uid` names one just done, whose cached copy may
    lag). A later event of that claim, or a resync, retries."""
    if not (objects.deleting(source) and objects.has_finalizer(source, CLONE_FINALIZER)):
        return
    namespace, name = objects.namespace(source), objects.name(source)
    in_progress = names.provisioning_finalizer(ctx.driver_name)
    for other in ctx.claims.list():
        ref = source_of(other)
        if objects.namespace(other) == namespace and ref and ref.get("kind") == "PersistentVolumeClaim" \
                and ref.get("name") == name and objects.uid(other) != finished_uid \
                and objects.has_finalizer(other, in_progress):
            log.info("source claim still being cloned; keeping its cloning finalizer",
                     extra=fields(claim=f"{namespace}/{name}", clone=objects.key(other)))
            return
    ctx.api.remove_pvc_finalizer(namespace, name, CLONE_FINALIZER)
    log.info("cloning finalizer released", extra=fields(claim=f"{namespace}/{name}"))


def release_after_clone(ctx: ProvisionerContext, claim: KubeObject) -> None:
    """After `claim` got its PV: its source claim, if being deleted, may lose the finalizer."""
    source = source_of(claim)
    if source is None or source.get("kind") != "PersistentVolumeClaim":
        return
    found = ctx.claims.get(f"{objects.namespace(claim)}/{source.get('name')}")
    if found is not None:
        release_clone_protection(ctx, found, finished_uid=objects.uid(claim))
