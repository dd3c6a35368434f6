"""The API writes and live reads the embedded sidecars make, each one call with one job; everything
else comes from the informer caches. Finalizers are strategic-merge patches (never drop another's
finalizer); failures are raised as cephcsi.errors naming the call. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes import client as k8s

from cephcsi.errors import CephCSIError, NotFound
from cephcsi.kube import apierrors
from cephcsi.sidecars import kubeerrors
from cephcsi.sidecars.objects import KubeObject


class KubeApi:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self._storage = k8s.StorageV1Api(api_client)

    # ---- reads ---------------------------------------------------------------------------------

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        """The Secret's data, decoded. The values are secrets: never log them."""
        body = self._call(f'get secret "{namespace}/{name}"',
                          lambda: self._core.read_namespaced_secret(name, namespace, _preload_content=False))
        data = body.get("data") or {}
        values = {k: base64.b64decode(v).decode() for k, v in data.items()}
        values.update(body.get("stringData") or {})
        return values

    def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        """The ConfigMap's data (text values only; binaryData is not configuration)."""
        body = self._call(f'get configmap "{namespace}/{name}"',
                          lambda: self._core.read_namespaced_config_map(name, namespace, _preload_content=False))
        return {str(k): str(v) for k, v in (body.get("data") or {}).items()}

    def get_pv(self, name: str) -> KubeObject | None:
        return self._optional(f'get PersistentVolume "{name}"',
                              lambda: self._core.read_persistent_volume(name, _preload_content=False))

    def get_pvc(self, namespace: str, name: str) -> KubeObject | None:
        return self._optional(f'get PersistentVolumeClaim "{namespace}/{name}"',
                              lambda: self._core.read_namespaced_persistent_volume_claim(
                                  name, namespace, _preload_content=False))

    def get_storage_class(self, name: str) -> KubeObject | None:
        return self._optional(f'get StorageClass "{name}"',
                              lambda: self._storage.read_storage_class(name, _preload_content=False))

    def get_volume_attributes_class(self, name: str) -> KubeObject | None:
        return self._optional(f'get VolumeAttributesClass "{name}"',
                              lambda: self._storage.read_volume_attributes_class(name, _preload_content=False))

    # ---- PersistentVolumes ---------------------------------------------------------------------------

    def create_pv(self, body: KubeObject) -> KubeObject | None:
        """Create the PV; None when a PV of that name exists already (the caller adopts it)."""
        name = body["metadata"]["name"]
        try:
            response = self._core.create_persistent_volume(body, _preload_content=False)
        except Exception as exc:  # noqa: BLE001 - classified below
            if apierrors.is_already_exists(exc) or apierrors.is_conflict(exc):
                return None
            raise kubeerrors.translate(exc, f'create PersistentVolume "{name}"') from exc
        return _decode(response)

    def delete_pv(self, name: str) -> None:
        """Delete the PV (a PV already gone counts as deleted)."""
        self._optional(f'delete PersistentVolume "{name}"',
                       lambda: self._core.delete_persistent_volume(name, _preload_content=False))

    def add_pv_finalizer(self, name: str, finalizer: str) -> None:
        self._optional(f'add finalizer to PersistentVolume "{name}"',
                       lambda: self._core.patch_persistent_volume(
                           name, {"metadata": {"finalizers": [finalizer]}}, _preload_content=False))

    def remove_pv_finalizer(self, name: str, finalizer: str) -> None:
        self._optional(f'remove finalizer from PersistentVolume "{name}"',
                       lambda: self._core.patch_persistent_volume(
                           name, _remove_finalizer(finalizer), _preload_content=False))

    # ---- PersistentVolumeClaims --------------------------------------------------------------------

    def add_pvc_finalizer(self, namespace: str, name: str, finalizer: str) -> KubeObject:
        """Add the finalizer; the claim as the API server now has it. Fails (InvalidArgument)
        for a claim already being deleted: the API refuses new finalizers then."""
        return self._call(f'add finalizer to PersistentVolumeClaim "{namespace}/{name}"',
                          lambda: self._core.patch_namespaced_persistent_volume_claim(
                              name, namespace, {"metadata": {"finalizers": [finalizer]}}, _preload_content=False))

    def remove_pvc_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        self._optional(f'remove finalizer from PersistentVolumeClaim "{namespace}/{name}"',
                       lambda: self._core.patch_namespaced_persistent_volume_claim(
                           name, namespace, _remove_finalizer(finalizer), _preload_content=False))

    def remove_pvc_annotation(self, namespace: str, name: str, annotation: str) -> None:
        self._optional(f'remove annotation {annotation} from PersistentVolumeClaim "{namespace}/{name}"',
                       lambda: self._core.patch_namespaced_persistent_volume_claim(
                           name, namespace, {"metadata": {"annotations": {annotation: None}}}, _preload_content=False))

    # ---- VolumeAttachments -------------------------------------------------------------------------

    def mark_attached(self, name: str, metadata: dict[str, str] | None = None) -> None:
        """Patch the status subresource: attached=true (external-attacher's markAsAttached)."""
        status: dict[str, Any] = {"attached": True, "attachError": None}
        if metadata:
            status["attachmentMetadata"] = metadata
        self._call(f'mark VolumeAttachment "{name}" attached',
                   lambda: self._storage.patch_volume_attachment_status(
                       name, {"status": status}, _preload_content=False))

    def mark_detached(self, name: str) -> None:
        """Patch the status subresource: attached=false, no detachError or attachmentMetadata
        (external-attacher's markAsDetached, before it drops its finalizer)."""
        status = {"attached": False, "detachError": None, "attachmentMetadata": None}
        self._optional(f'mark VolumeAttachment "{name}" detached',
                       lambda: self._storage.patch_volume_attachment_status(
                           name, {"status": status}, _preload_content=False))

    def remove_attachment_finalizer(self, name: str, finalizer: str) -> None:
        self._optional(f'remove finalizer from VolumeAttachment "{name}"',
                       lambda: self._storage.patch_volume_attachment(
                           name, _remove_finalizer(finalizer), _preload_content=False))

    # ---- helpers -----------------------------------------------------------------------------------

    def _call(self, what: str, call: Callable[[], urllib3.BaseHTTPResponse]) -> KubeObject:
        return call_json(what, call)

    def _optional(self, what: str, call: Callable[[], urllib3.BaseHTTPResponse]) -> KubeObject | None:
        try:
            return self._call(what, call)
        except NotFound:
            return None


def _remove_finalizer(finalizer: str) -> dict[str, Any]:
    # Strategic merge: ObjectMeta.finalizers is a merge list of strings.
    return {"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}}


def call_json(what: str, call: Callable[[], urllib3.BaseHTTPResponse]) -> KubeObject:
    """One raw (`_preload_content=False`) client call: its JSON body, or the failure translated
    into the driver's errors with `what` in the message. The sidecars' API classes share it."""
    try:
        return _decode(call())
    except CephCSIError:
        raise
    except Exception as exc:  # noqa: BLE001 - every client failure is translated
        raise kubeerrors.translate(exc, what) from exc


def _decode(response: urllib3.BaseHTTPResponse) -> KubeObject:
    try:
        data = response.data
    finally:
        response.release_conn()
    decoded: KubeObject = json.loads(data) if data else {}
    return decoded
