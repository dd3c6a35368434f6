"""The attacher's leader-only loop: VolumeAttachments with spec.attacher == driver → one work
queue (key: the VolumeAttachment name) → the chosen AttachStrategy.

Like the provisioner's loop, one `start` → `stop` is one leadership term (handlers replay the
cache at start; the queue is dropped at stop). Failures are retried with the per-key backoff
(--retry-interval-start/max); handlers resync every `resync` seconds (external-attacher's
--resync is 10 minutes).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cephcsi.kube.informer import EventHandler, HandlerRegistration, Informer
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import kubeerrors, objects
from cephcsi.sidecars.attacher.fencing import Unfencer
from cephcsi.sidecars.attacher.strategy import AttachStrategy, VolumeFinalizing
from cephcsi.sidecars.objects import KubeObject

log = logging.getLogger(__name__)

NODE_KEY_PREFIX = "node/"
REFRESH_FENCED = "fencing/refresh"
ATTACHMENTS_BY_PV_INDEX = "cephcsi-attacher-by-pv"
PV_KEY_PREFIX = "pv/"
"""Work-queue keys for PVs ('/' never appears in a VolumeAttachment name)."""


def attachment_pv(attachment: KubeObject) -> list[str]:
    """Index function: the PV a VolumeAttachment attaches."""
    pv = (objects.spec(attachment).get("source") or {}).get("persistentVolumeName")
    return [str(pv)] if pv else []


class AttacherLoop:
    def __init__(self, driver_name: str, attachments: Informer, strategy: AttachStrategy, *, workers: int,
                 backoff: ItemBackoffSettings, resync: float = 600.0, volumes: Informer | None = None,
                 nodes: Informer | None = None,
                 unfencer: Unfencer | None = None, node_id_of: Callable[[str], str] | None = None) -> None:
        self.driver_name = driver_name
        self.attachments = attachments
        self.strategy = strategy
        # PVs the publishing strategy finalizes; their keys are "pv/<name>".
        self.volumes = volumes
        # Nodes whose out-of-service taint went away: their blocklist entries are removed (fencing.py).
        self.nodes = nodes
        self.unfencer = unfencer
        self.node_id_of = node_id_of or (lambda name: name)
        if isinstance(strategy, VolumeFinalizing):
            attachments.add_indexers({ATTACHMENTS_BY_PV_INDEX: attachment_pv})
        self.workers = workers
        self.backoff = backoff
        self.resync = resync
        self._lock = threading.Lock()
        self._pool: Workers[str] | None = None
        self._registration: HandlerRegistration | None = None
        self._volume_registration: HandlerRegistration | None = None
        self._node_registration: HandlerRegistration | None = None
        self._queue: WorkQueue[str] | None = None

    def start(self, stop: threading.Event) -> None:
        work_queue: WorkQueue[str] = WorkQueue("attacher", rate_limiter=ItemExponentialBackoff(self.backoff))
        with self._lock:
            self._queue = work_queue
        pool = Workers(work_queue, self._process, count=self.workers, expected=kubeerrors.EXPLAINED)
        pool.start()

        def changed(attachment: KubeObject) -> None:
            if objects.spec(attachment).get("attacher") == self.driver_name and not self.strategy.settled(attachment):
                work_queue.add(objects.name(attachment))

        def deleted(attachment: KubeObject, _unknown: bool) -> None:
            # The PV it named may now shed the attacher's finalizer.
            if isinstance(self.strategy, VolumeFinalizing):
                for pv_name in attachment_pv(attachment):
                    work_queue.add(PV_KEY_PREFIX + pv_name)

        registration = self.attachments.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), on_delete=deleted, resync_period=self.resync))
        volume_registration = self._watch_volumes(work_queue)
        node_registration = self._watch_nodes(work_queue)
        with self._lock:
            self._pool, self._registration = pool, registration
            self._volume_registration = volume_registration
            self._node_registration = node_registration
        log.info("attacher started", extra=fields(strategy=self.strategy.name, workers=self.workers))

    def stop(self, timeout: float) -> bool:
        with self._lock:
            pool, registration = self._pool, self._registration
            volume_registration, self._volume_registration = self._volume_registration, None
            node_registration, self._node_registration = self._node_registration, None
            self._pool = self._registration = None
        if registration is not None:
            self.attachments.remove_handler(registration)
        if volume_registration is not None and self.volumes is not None:
            self.volumes.remove_handler(volume_registration)
        if node_registration is not None and self.nodes is not None:
            self.nodes.remove_handler(node_registration)
        stopped = pool.stop(timeout=timeout) if pool is not None else True
        log.info("attacher stopped", extra=fields(clean=stopped))
        return stopped

    def _watch_volumes(self, work_queue: WorkQueue[str]) -> HandlerRegistration | None:
        finalizing = self.strategy if isinstance(self.strategy, VolumeFinalizing) else None
        if finalizing is None or self.volumes is None:
            return None

        def changed(pv: KubeObject) -> None:
            if finalizing.wants_volume(pv):
                work_queue.add(PV_KEY_PREFIX + objects.name(pv))

        return self.volumes.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), resync_period=self.resync))

    def _refresh_fenced(self) -> None:
        if self.unfencer is None or self.nodes is None:
            return
        fenced = self.unfencer.refresh()
        if fenced:
            log.info("nodes with blocklist entries in the fence ledgers", extra=fields(nodes=fenced))
        with self._lock:
            queue = self._queue
        for node in self.nodes.list():
            if queue is not None and self.unfencer.wants(node, self.node_id_of(objects.name(node))):
                queue.add(NODE_KEY_PREFIX + objects.name(node))

    def _watch_nodes(self, work_queue: WorkQueue[str]) -> HandlerRegistration | None:
        unfencer = self.unfencer
        if unfencer is None or self.nodes is None:
            return None

        def changed(node: KubeObject) -> None:
            if unfencer.wants(node, self.node_id_of(objects.name(node))):
                work_queue.add(NODE_KEY_PREFIX + objects.name(node))

        # Which nodes the fence ledgers name is read once per term, by a worker.
        work_queue.add(REFRESH_FENCED)
        return self.nodes.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), resync_period=self.resync))

    def _process(self, name: str) -> None:
        with request_scope():
            if name == REFRESH_FENCED:
                self._refresh_fenced()
                return
            if name.startswith(NODE_KEY_PREFIX):
                node = self.nodes.get(name[len(NODE_KEY_PREFIX):]) if self.nodes is not None else None
                if node is not None and self.unfencer is not None:
                    self.unfencer.sync(node, self.node_id_of(objects.name(node)))
                return
            if name.startswith(PV_KEY_PREFIX):
                pv = self.volumes.get(name[len(PV_KEY_PREFIX):]) if self.volumes is not None else None
                if pv is not None and isinstance(self.strategy, VolumeFinalizing):
                    self.strategy.sync_volume(pv, self.attachments.by_index(ATTACHMENTS_BY_PV_INDEX, objects.name(pv)))
                return
            attachment = self.attachments.get(name)
            if attachment is None or objects.spec(attachment).get("attacher") != self.driver_name:
                return
            self.strategy.sync(attachment)
