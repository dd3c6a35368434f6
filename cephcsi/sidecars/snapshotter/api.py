"""API calls on the snapshot.storage.k8s.io/v1 objects (CRDs of kubernetes-csi/external-snapshotter).

Contents are cluster-scoped; VolumeSnapshots and VolumeSnapshotClasses are read live (one call
per snapshot, like the sidecar's listers would answer a moment later). Status is written with a
merge patch on the status subresource, annotations and finalizers with merge patches that name
only our keys, so no update conflicts with the snapshot-controller's own writes.
"""
from __future__ import annotations

import json
from typing import Any

from kubernetes import client as k8s

from cephcsi.errors import CephCSIError, NotFound
from cephcsi.sidecars import kubeerrors
from cephcsi.sidecars.objects import KubeObject

GROUP = "snapshot.storage.k8s.io"
VERSION = "v1"
CONTENTS = "volumesnapshotcontents"
SNAPSHOTS = "volumesnapshots"
CLASSES = "volumesnapshotclasses"


class SnapshotApi:
    """Also the base of the group snapshotter's API (`cephcsi.sidecars.groupsnapshotter.api`):
    the same calls on another group's contents and classes."""

    group, version, contents, classes = GROUP, VERSION, CONTENTS, CLASSES
    content_kind, class_kind = "VolumeSnapshotContent", "VolumeSnapshotClass"

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._client = api_client
        self._custom = k8s.CustomObjectsApi(api_client)

    def served(self) -> bool:
        """Whether the apiserver serves the contents: one discovery GET of /apis/<group>/<version>
        (False on 404, i.e. the CRDs are not installed)."""
        what = f"discover {self.group}/{self.version}"
        try:
            response = self._client.call_api(f"/apis/{self.group}/{self.version}", "GET", header_params={"Accept": "application/json"},
                                             auth_settings=["BearerToken"], _preload_content=False,
                                             _return_http_data_only=True)
        except Exception as exc:  # noqa: BLE001 - every client failure is translated
            translated = kubeerrors.translate(exc, what)
            if isinstance(translated, NotFound):
                return False
            raise translated from exc
        try:
            data = response.data
        finally:
            response.release_conn()
        resources = (json.loads(data) if data else {}).get("resources") or []
        return any(r.get("name") == self.contents for r in resources)

    def list_contents(self, **kwargs: Any) -> Any:
        """List/watch the contents (the informer's list function, keyword arguments)."""
        return self._custom.list_cluster_custom_object(self.group, self.version, self.contents, **kwargs)

    def get_content(self, name: str) -> KubeObject | None:
        return self._optional(f'get {self.content_kind} "{name}"',
                              lambda: self._custom.get_cluster_custom_object(self.group, self.version, self.contents, name,
                                                                              _preload_content=False))

    def get_snapshot(self, namespace: str, name: str) -> KubeObject | None:
        return self._optional(f'get VolumeSnapshot "{namespace}/{name}"',
                              lambda: self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SNAPSHOTS,
                                                                                 name, _preload_content=False))

    def get_class(self, name: str) -> KubeObject | None:
        return self._optional(f'get {self.class_kind} "{name}"',
                              lambda: self._custom.get_cluster_custom_object(self.group, self.version, self.classes, name,
                                                                              _preload_content=False))

    def patch_content(self, name: str, patch: dict[str, Any]) -> KubeObject | None:
        """Merge-patch metadata/spec; None when the content is gone."""
        return self._optional(f'patch {self.content_kind} "{name}"',
                              lambda: self._custom.patch_cluster_custom_object(self.group, self.version, self.contents, name, patch,
                                                                                _preload_content=False))

    def patch_content_status(self, name: str, status: dict[str, Any]) -> KubeObject | None:
        return self._optional(f'update status of {self.content_kind} "{name}"',
                              lambda: self._custom.patch_cluster_custom_object_status(
                                  self.group, self.version, self.contents, name, {"status": status}, _preload_content=False))

    def _optional(self, what: str, call: Any) -> KubeObject | None:
        try:
            response = call()
        except CephCSIError:
            raise
        except Exception as exc:  # noqa: BLE001 - every client failure is translated
            translated = kubeerrors.translate(exc, what)
            if isinstance(translated, NotFound):
                return None
            raise translated from exc
        try:
            data = response.data
        finally:
            release = getattr(response, "release_conn", None)
            if release is not None:
                release()
        decoded: KubeObject = json.loads(data) if data else {}
        return decoded
