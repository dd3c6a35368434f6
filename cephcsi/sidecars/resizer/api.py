"""The two writes the resizer makes, as JSON merge patches: the claim's status (subresource; the patch
that starts a resize carries the claim's resourceVersion) and the PV's capacity. Design:
docs/design/sidecars.md.
"""
from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from cephcsi.sidecars import objects
from cephcsi.sidecars.api import call_json
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.request import format_bytes

_MERGE_PATCH = "application/merge-patch+json"


class ResizerApi:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._client = api_client

    def patch_claim_status(self, claim: KubeObject, status: dict[str, Any], check_version: bool) -> KubeObject:
        """The claim as the API server has it after the patch."""
        body: dict[str, Any] = {"status": status}
        if check_version:
            body["metadata"] = {"resourceVersion": str(objects.meta(claim).get("resourceVersion") or "")}
        namespace, name = objects.namespace(claim), objects.name(claim)
        return self._patch(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}/status", body,
                           f'update status of PersistentVolumeClaim "{namespace}/{name}"')

    def grow_pv_capacity(self, pv: KubeObject, size: int) -> KubeObject:
        name = objects.name(pv)
        body = {"spec": {"capacity": {"storage": format_bytes(size)}}}
        return self._patch(f"/api/v1/persistentvolumes/{name}", body, f'update capacity of PersistentVolume "{name}"')

    def set_pv_class(self, pv: KubeObject, vac_name: str) -> KubeObject:
        name = objects.name(pv)
        body = {"spec": {"volumeAttributesClassName": vac_name}}
        return self._patch(f"/api/v1/persistentvolumes/{name}", body,
                           f'update volumeAttributesClassName of PersistentVolume "{name}"')

    def _patch(self, path: str, body: dict[str, Any], what: str) -> KubeObject:
        return call_json(what, lambda: self._client.call_api(
            path, "PATCH", header_params={"Content-Type": _MERGE_PATCH, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
        ))
