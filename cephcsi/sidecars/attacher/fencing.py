"""Nodes as the controller sees them through Kubernetes: which node ids exist, which are out of
service (fence them on unpublish), and unfencing once such a node is back.

Unfencing runs once the out-of-service taint is gone and the node is Ready: its fence-ledger
entries leave the blocklist, then the ledgers. Read-only on Nodes; heartbeats cost no Ceph round
trip. Non-graceful shutdown and the ledger: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from cephcsi.ceph.credentials import Credentials
from cephcsi.kube.informer import Informer
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.attacher.api import AttacherApi
from cephcsi.sidecars.objects import KubeObject
from cephcsi.volumes.publish import Publisher

log = logging.getLogger(__name__)

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


def tainted(node: KubeObject | None) -> bool:
    return any(t.get("key") == OUT_OF_SERVICE for t in (objects.spec(node).get("taints") or [])) if node else False


def ready(node: KubeObject) -> bool:
    conditions = (objects.status(node).get("conditions") or [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class KubeNodes:
    """cephcsi.volumes.publish.NodeDirectory from the Node and CSINode informers."""

    def __init__(self, api: AttacherApi, driver_name: str, nodes: Informer, csinodes: Informer,
                 on_fence: Callable[[str], None] | None = None) -> None:
        self.api = api
        self.driver_name = driver_name
        self.nodes = nodes
        self.csinodes = csinodes
        self.on_fence = on_fence

    def node_name(self, node_id: str) -> str:
        for csinode in self.csinodes.list():
            for driver in objects.spec(csinode).get("drivers") or []:
                if driver.get("name") == self.driver_name and driver.get("nodeID") == node_id:
                    return objects.name(csinode)
        return node_id

    def exists(self, node_id: str) -> bool | None:
        if not (self.nodes.has_synced() and self.csinodes.has_synced()):
            return None
        return self.nodes.get(self.node_name(node_id)) is not None

    def out_of_service(self, node_id: str) -> bool:
        # A live read: the taint may be seconds old, and this decides whether to fence.
        name = self.node_name(node_id)
        if not tainted(self.api.get_node(name)):
            return False
        if self.on_fence is not None:
            self.on_fence(node_id)
        return True


SecretsOf = Callable[[KubeObject], dict[str, str]]


class Unfencer:
    """Removes a returned node's blocklist entries (see the module docstring)."""

    def __init__(self, api: AttacherApi, driver_name: str, publisher: Publisher, volumes: Informer,
                 secrets_of: SecretsOf) -> None:
        self.api = api
        self.driver_name = driver_name
        self.publisher = publisher
        self.volumes = volumes
        self.secrets_of = secrets_of
        self._lock = threading.Lock()
        self._fenced: set[str] = set()
        """Node ids the ledgers hold entries for (or that were fenced since the last refresh)."""

    def note(self, node_id: str) -> None:
        with self._lock:
            self._fenced.add(node_id)

    def refresh(self) -> list[str]:
        """Re-read which nodes the ledgers hold entries for; those nodes."""
        found: set[str] = set()
        for (cluster_id, pool), pv in sorted(self._pools().items()):
            secrets = self.secrets_of(pv)
            if secrets:
                ledger = self.publisher.fenced(cluster_id, pool, Credentials.from_secrets(secrets))
                found |= {key.partition("/")[0] for key in ledger}
        with self._lock:
            self._fenced |= found
            return sorted(self._fenced)

    def wants(self, node: KubeObject, node_id: str) -> bool:
        with self._lock:
            fenced = node_id in self._fenced
        return fenced and not tainted(node) and ready(node)

    def sync(self, node: KubeObject, node_id: str) -> None:
        if not self.wants(node, node_id):
            return
        name = objects.name(node)
        removed: list[str] = []
        complete = True
        for (cluster_id, pool), pv in sorted(self._pools().items()):
            secrets = self.secrets_of(pv)
            if not secrets:
                log.warning("no secret reaches this pool's fence ledger; its entries for the node stay", extra=fields(
                    node=name, cluster=cluster_id, pool=pool, pv=objects.name(pv)))
                complete = False
                continue
            removed += self.publisher.unfence(cluster_id, pool, node_id, Credentials.from_secrets(secrets))
        if complete:
            with self._lock:
                self._fenced.discard(node_id)
        log.warning("node back in service: its Ceph blocklist entries are removed",
                    extra=fields(node=name, node_id=node_id, addresses=removed))

    def _pools(self) -> dict[tuple[str, str], KubeObject]:
        """One PV of this driver per (clusterID, pool) its volumes live in: whose secrets reach it."""
        found: dict[tuple[str, str], KubeObject] = {}
        for pv in self.volumes.list():
            csi: dict[str, Any] = dict(objects.spec(pv).get("csi") or {})
            if csi.get("driver") != self.driver_name:
                continue
            attributes = csi.get("volumeAttributes") or {}
            key = (str(attributes.get("clusterID") or ""), str(attributes.get("pool") or ""))
            if all(key) and key not in found:
                found[key] = pv
        return found
