"""Shared informer factory: one informer per (resource, namespace, selectors) per process.
Register handlers and indexers, then `start()`, then `wait_for_sync()` before starting workers.
Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Mapping

from kubernetes import client as k8s

from cephcsi.kube.handlers import DispatchLoop
from cephcsi.kube.informer import Informer, InformerSettings
from cephcsi.kube.store import IndexFunc

log = logging.getLogger(__name__)

_Key = tuple[str, str, str, str, str]


class InformerFactory:
    """Creates and owns shared informers; thread-safe."""

    def __init__(self, api_client: k8s.ApiClient, *, settings: InformerSettings = InformerSettings()) -> None:
        self.api_client = api_client
        self.settings = settings
        self._lock = threading.Lock()
        self._informers: dict[_Key, Informer] = {}
        # One handler thread for every informer of the factory (their handlers only queue keys).
        self._dispatch_loop = DispatchLoop("informer-handlers")

    @property
    def dispatch_loop(self) -> DispatchLoop:
        """The handler thread of the factory's informers, for an informer kept outside the
        factory (its own sync, not waited for) that need not cost a thread of its own."""
        return self._dispatch_loop

    def for_resource(self, api_class: type, list_method: str, *, namespace: str | None = None,
                     label_selector: str | None = None, field_selector: str | None = None,
                     indexers: Mapping[str, IndexFunc] | None = None) -> Informer:
        """The shared informer listing with `api_class(api_client).<list_method>`.

        Use the cluster-wide method (e.g. CoreV1Api, "list_persistent_volume_claim_for_all_namespaces")
        or a namespaced one with `namespace` (e.g. "list_namespaced_config_map", namespace="ns")."""
        key: _Key = (api_class.__name__, list_method, namespace or "", label_selector or "", field_selector or "")
        with self._lock:
            informer = self._informers.get(key)
            if informer is None:
                func: Any = getattr(api_class(self.api_client), list_method)
                if namespace is not None:
                    func = functools.partial(func, namespace)
                informer = Informer(func, name=_name(list_method, namespace, label_selector, field_selector),
                                    settings=self.settings, label_selector=label_selector,
                                    field_selector=field_selector, dispatch_loop=self._dispatch_loop)
                self._informers[key] = informer
        if indexers:
            informer.add_indexers(indexers)
        return informer

    # Shortcuts for the resources the sidecars use.

    def persistent_volumes(self) -> Informer:
        """All PersistentVolumes."""
        return self.for_resource(k8s.CoreV1Api, "list_persistent_volume")

    def persistent_volume_claims(self) -> Informer:
        """PersistentVolumeClaims in all namespaces."""
        return self.for_resource(k8s.CoreV1Api, "list_persistent_volume_claim_for_all_namespaces")

    def storage_classes(self) -> Informer:
        """All StorageClasses."""
        return self.for_resource(k8s.StorageV1Api, "list_storage_class")

    def volume_attachments(self) -> Informer:
        """All VolumeAttachments."""
        return self.for_resource(k8s.StorageV1Api, "list_volume_attachment")

    def nodes(self) -> Informer:
        """All Nodes."""
        return self.for_resource(k8s.CoreV1Api, "list_node")

    def csi_nodes(self) -> Informer:
        """All CSINodes."""
        return self.for_resource(k8s.StorageV1Api, "list_csi_node")

    # Lifecycle.

    def informers(self) -> list[Informer]:
        """Every informer created so far."""
        with self._lock:
            return list(self._informers.values())

    def start(self) -> None:
        """Start every informer not started yet."""
        for informer in self.informers():
            informer.start()

    def wait_for_sync(self, timeout: float) -> bool:
        """Wait until every started informer has synced; False on timeout. Not logged: callers
        poll this while a large cluster loads, which is normal (they say when it is slow)."""
        deadline = time.monotonic() + timeout
        for informer in self.informers():
            if not informer.wait_for_sync(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def unsynced(self) -> list[str]:
        """Names of the informers still loading."""
        return [informer.name for informer in self.informers() if not informer.has_synced()]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every informer."""
        deadline = time.monotonic() + timeout
        for informer in self.informers():
            informer.stop(max(0.0, deadline - time.monotonic()))


def _name(list_method: str, namespace: str | None, label_selector: str | None, field_selector: str | None) -> str:
    resource = list_method.removeprefix("list_").removeprefix("namespaced_").removesuffix("_for_all_namespaces")
    parts = [f"{namespace}/{resource}" if namespace else resource]
    if label_selector:
        parts.append(f"l={label_selector}")
    if field_selector:
        parts.append(f"f={field_selector}")
    return ",".join(parts)
