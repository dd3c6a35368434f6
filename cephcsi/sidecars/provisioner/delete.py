"""The volume worker: delete released volumes and manage the PV finalizer, as external-provisioner.
Failures: a Warning event VolumeFailedDelete on the PV, retried with backoff. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.errors import FailedPrecondition, InvalidArgument, NotFound
from cephcsi.kube.events import WARNING
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import metrics, objects
from cephcsi.sidecars.calls import Stopping
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner import names, secrets
from cephcsi.sidecars.provisioner.context import ProvisionerContext
from cephcsi.sidecars.provisioner.outcome import describe
from cephcsi.sidecars.provisioner.static import StaticGuard, is_static_pv

log = logging.getLogger(__name__)

ATTACHED_PV_INDEX = "cephcsi-by-pv"


def attachment_pv_index(attachment: KubeObject) -> list[str]:
    """Index function for VolumeAttachments: the PV they attach."""
    pv = (objects.spec(attachment).get("source") or {}).get("persistentVolumeName")
    return [str(pv)] if pv else []


def is_ours(pv: KubeObject, driver_name: str) -> bool:
    annotations = objects.annotations_of(pv)
    provisioner = annotations.get(names.ANN_PROVISIONED_BY) or annotations.get(names.ANN_MIGRATED_TO)
    csi = objects.spec(pv).get("csi") or {}
    return provisioner == driver_name and csi.get("driver") == driver_name


def phase(pv: KubeObject) -> str:
    return str(objects.status(pv).get("phase") or "")


def released(pv: KubeObject) -> bool:
    """Ready for DeleteVolume as far as the PV object itself tells (claim checks aside).

    A PV being deleted without our finalizer is past our part (we deleted it, or it was never
    ours to guard); one being deleted with it is ours to finish unless still Bound."""
    if objects.deleting(pv):
        return objects.has_finalizer(pv, names.PV_FINALIZER) and phase(pv) != "Bound"
    return phase(pv) == "Released"


def settled(pv: KubeObject, claim_uid_of: Callable[[str], str | None]) -> bool:
    """A Delete-policy PV of ours that needs nothing from the worker: Bound, guarded by our
    finalizer, not being deleted, and its claim (`claim_uid_of("<namespace>/<name>")`, from the
    cache) still the one it was bound to. Static PVs and anything uncertain go to the worker."""
    spec = objects.spec(pv)
    ref = spec.get("claimRef") or {}
    return (spec.get("persistentVolumeReclaimPolicy") == names.RECLAIM_DELETE and phase(pv) == "Bound"
            and not objects.deleting(pv) and objects.has_finalizer(pv, names.PV_FINALIZER)
            and bool(ref.get("uid")) and claim_uid_of(f"{ref.get('namespace')}/{ref.get('name')}") == ref.get("uid"))


class VolumeWorker:
    def __init__(self, ctx: ProvisionerContext, stop: threading.Event) -> None:
        self.ctx = ctx
        self.stop = stop
        self.static = StaticGuard(ctx)

    def process(self, name: str) -> None:
        with request_scope():
            pv = self.ctx.volumes.get(name)
            if pv is not None and is_static_pv(pv, self.ctx.driver_name):
                self.static.process(pv)  # a pre-provisioned image is never deleted
                return
            if pv is None or not is_ours(pv, self.ctx.driver_name):
                return
            policy = objects.spec(pv).get("persistentVolumeReclaimPolicy")
            has_finalizer = objects.has_finalizer(pv, names.PV_FINALIZER)
            if policy != names.RECLAIM_DELETE:
                if has_finalizer:
                    self.ctx.api.remove_pv_finalizer(name, names.PV_FINALIZER)
                    log.info("finalizer removed; reclaim policy keeps the volume", extra=fields(pv=name, policy=policy))
                return
            if not has_finalizer and not objects.deleting(pv):
                self.ctx.api.add_pv_finalizer(name, names.PV_FINALIZER)
            if not (released(pv) or self._claim_gone(pv)):
                return
            self.delete(pv)

    def _claim_gone(self, pv: KubeObject) -> bool:
        """The PV's claim no longer exists (checked live) though the PV is not Released yet."""
        if objects.deleting(pv) or phase(pv) not in ("Bound", "Available"):
            return False
        ref = objects.spec(pv).get("claimRef") or {}
        uid, namespace, claim_name = ref.get("uid"), ref.get("namespace"), ref.get("name")
        if not (uid and namespace and claim_name):
            return False
        cached = self.ctx.claims.get(f"{namespace}/{claim_name}")
        if cached is not None and objects.uid(cached) == uid:
            return False
        live = self.ctx.api.get_pvc(namespace, claim_name)
        return live is None or objects.uid(live) != uid

    def delete(self, pv: KubeObject) -> None:
        name = objects.name(pv)
        class_name = str(objects.spec(pv).get("storageClassName") or "")
        started = time.monotonic()
        try:
            deleted = self._delete(name)
        except Stopping:
            raise
        except Exception as error:
            metrics.DELETE_FAILED.labels(class_name).inc()
            metrics.OPERATIONS.labels("delete", "error").observe(time.monotonic() - started)
            self.ctx.events.event(pv, WARNING, "VolumeFailedDelete", describe(error))
            log.warning("volume deletion failed", extra=fields(pv=name, error=describe(error)))
            raise
        if deleted:
            elapsed = time.monotonic() - started
            metrics.DELETE_TOTAL.labels(class_name).inc()
            metrics.DELETE_DURATION.labels(class_name).observe(elapsed)
            metrics.OPERATIONS.labels("delete", "success").observe(elapsed)
            log.info("volume deleted", extra=fields(pv=name, seconds=round(elapsed, 3)))

    def _delete(self, name: str) -> bool:
        ctx = self.ctx
        attached = ctx.attachments.by_index(ATTACHED_PV_INDEX, name)
        if attached:
            node = objects.spec(attached[0]).get("nodeName", "?")
            raise FailedPrecondition(f"persistentvolume {name} is still attached to node {node}")
        live = ctx.api.get_pv(name)
        if live is None or not is_ours(live, ctx.driver_name) or not (released(live) or self._claim_gone(live)):
            return False
        handle = str((objects.spec(live).get("csi") or {}).get("volumeHandle") or "")
        secret_values = self._deletion_secret(live)
        request = csi_pb2.DeleteVolumeRequest(volume_id=handle, secrets=secret_values)
        ctx.calls.run("DeleteVolume", name, lambda: ctx.controller.DeleteVolume(request, None), self.stop)
        ctx.api.delete_pv(name)
        ctx.api.remove_pv_finalizer(name, names.PV_FINALIZER)
        return True

    def _deletion_secret(self, pv: KubeObject) -> dict[str, str]:
        annotations = objects.annotations_of(pv)
        secret_name = annotations.get(names.ANN_DELETION_SECRET_NAME)
        secret_namespace = annotations.get(names.ANN_DELETION_SECRET_NAMESPACE)
        ref: secrets.SecretRef | None = None
        if secret_name and secret_namespace:
            ref = secrets.SecretRef(secret_name, secret_namespace)
        else:
            ref = self._class_secret(pv)
        if ref is None:
            return {}
        try:
            return self.ctx.api.read_secret(ref.namespace, ref.name)
        except NotFound:
            raise FailedPrecondition(
                f'the provisioner secret "{ref.namespace}/{ref.name}" needed to delete the volume is gone; '
                "recreate it to let the deletion proceed"
            ) from None

    def _class_secret(self, pv: KubeObject) -> secrets.SecretRef | None:
        """PVs without deletion-secret annotations: resolve from the class, with only what the
        PV still tells about its claim (name and namespace)."""
        storage_class = self.ctx.storage_class(str(objects.spec(pv).get("storageClassName") or ""))
        if storage_class is None:
            return None
        ref = objects.spec(pv).get("claimRef") or {}
        stub: dict[str, Any] = {"metadata": {"name": ref.get("name", ""), "namespace": ref.get("namespace", "")}}
        try:
            return secrets.secret_ref(secrets.PROVISIONER, storage_class.get("parameters") or {}, objects.name(pv), stub)
        except InvalidArgument as error:
            raise FailedPrecondition(f"cannot resolve the deletion secret from the StorageClass: {error}") from None
