"""The API calls of capacity tracking: CSIStorageCapacity writes in the controller's namespace,
and the owner lookup (the controller's Pod, then its controllers up `level` steps)."""
from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from cephcsi.errors import ConfigError, NotFound
from cephcsi.sidecars import objects
from cephcsi.sidecars.api import call_json as _call
from cephcsi.sidecars.objects import KubeObject

# The kinds a Pod's controller chain may hold, and how to read each (apps/v1).
_APPS_READERS = {
    "ReplicaSet": "read_namespaced_replica_set",
    "Deployment": "read_namespaced_deployment",
    "StatefulSet": "read_namespaced_stateful_set",
    "DaemonSet": "read_namespaced_daemon_set",
}


class CapacityApi:
    def __init__(self, api_client: k8s.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self._storage = k8s.StorageV1Api(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._apps = k8s.AppsV1Api(api_client)

    def create(self, body: KubeObject) -> KubeObject:
        return _call(f'create CSIStorageCapacity for class "{body.get("storageClassName")}"',
                     lambda: self._storage.create_namespaced_csi_storage_capacity(
                         self.namespace, body, _preload_content=False))

    def update(self, body: KubeObject) -> KubeObject:
        """Replace the object (its resourceVersion guards against a concurrent change: ABORTED)."""
        name = objects.name(body)
        return _call(f'update CSIStorageCapacity "{self.namespace}/{name}"',
                     lambda: self._storage.replace_namespaced_csi_storage_capacity(
                         name, self.namespace, body, _preload_content=False))

    def delete(self, name: str) -> None:
        try:
            _call(f'delete CSIStorageCapacity "{self.namespace}/{name}"',
                  lambda: self._storage.delete_namespaced_csi_storage_capacity(
                      name, self.namespace, _preload_content=False))
        except NotFound:
            pass

    def owner(self, pod_name: str, level: int) -> dict[str, Any]:
        """external-provisioner's --capacity-ownerref-level: 0 the Pod itself, 1 its controller
        (a ReplicaSet, StatefulSet or DaemonSet), 2 that one's (a Deployment), ..."""
        current = _call(f'get Pod "{self.namespace}/{pod_name}"', lambda: self._core.read_namespaced_pod(
            pod_name, self.namespace, _preload_content=False))
        kind, api_version = "Pod", "v1"
        for step in range(level):
            ref = next((r for r in objects.meta(current).get("ownerReferences") or [] if r.get("controller")), None)
            if ref is None:
                raise ConfigError(f"--capacity-ownerref-level={level}: {kind} {objects.name(current)!r} "
                                  f"(step {step}) has no controller to own CSIStorageCapacity objects; use a "
                                  "lower level, or -1 for no owner")
            kind, api_version = str(ref.get("kind")), str(ref.get("apiVersion"))
            reader = _APPS_READERS.get(kind)
            if reader is None or not api_version.startswith("apps/"):
                raise ConfigError(f"--capacity-ownerref-level={level}: cannot follow owner {api_version} {kind} "
                                  f"{ref.get('name')!r}; use a lower level")
            name = str(ref.get("name"))
            current = _call(f'get {kind} "{self.namespace}/{name}"',
                            lambda: getattr(self._apps, reader)(name, self.namespace, _preload_content=False))
        return {"apiVersion": api_version, "kind": kind, "name": objects.name(current),
                "uid": objects.uid(current), "controller": True}
