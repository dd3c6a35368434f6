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

from cephcsi.kube.informer import EventHandler, HandlerRegistration, Informer
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers
from cephcsi.observability.logging import fields, request_scope
from cephcsi.sidecars import kubeerrors, objects
from cephcsi.sidecars.attacher import legacy
from cephcsi.sidecars.attacher.legacy import LegacyTakeover
from cephcsi.sidecars.attacher.strategy import AttachStrategy
from cephcsi.sidecars.objects import KubeObject

log = logging.getLogger(__name__)


class AttacherLoop:
    def __init__(self, driver_name: str, attachments: Informer, strategy: AttachStrategy, *, workers: int,
                 backoff: ItemBackoffSettings, resync: float = 600.0, volumes: Informer | None = None,
                 takeover: LegacyTakeover | None = None) -> None:
        self.driver_name = driver_name
        self.attachments = attachments
        self.strategy = strategy
        # Attachments and PVs left by ceph-csi >= 3.15's attacher (see legacy.py); PV keys are "pv/<name>".
        self.volumes = volumes
        self.takeover = takeover
        if takeover is not None:
            attachments.add_indexers({legacy.ATTACHMENTS_BY_PV_INDEX: legacy.attachment_pv})
        self.workers = workers
        self.backoff = backoff
        self.resync = resync
        self._lock = threading.Lock()
        self._pool: Workers[str] | None = None
        self._registration: HandlerRegistration | None = None
        self._volume_registration: HandlerRegistration | None = None

    def start(self, stop: threading.Event) -> None:
        work_queue: WorkQueue[str] = WorkQueue("attacher", rate_limiter=ItemExponentialBackoff(self.backoff))
        pool = Workers(work_queue, self._process, count=self.workers, expected=kubeerrors.EXPLAINED)
        pool.start()

        def changed(attachment: KubeObject) -> None:
            if objects.spec(attachment).get("attacher") == self.driver_name:
                work_queue.add(objects.name(attachment))

        def deleted(attachment: KubeObject, _unknown: bool) -> None:
            # The PV it named may now shed the old attacher's finalizer.
            if self.takeover is not None:
                for pv_name in legacy.attachment_pv(attachment):
                    work_queue.add(legacy.PV_KEY_PREFIX + pv_name)

        registration = self.attachments.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), on_delete=deleted, resync_period=self.resync))
        volume_registration = self._watch_volumes(work_queue)
        with self._lock:
            self._pool, self._registration = pool, registration
            self._volume_registration = volume_registration
        log.info("attacher started", extra=fields(strategy=self.strategy.name, workers=self.workers))

    def stop(self, timeout: float) -> bool:
        with self._lock:
            pool, registration = self._pool, self._registration
            volume_registration, self._volume_registration = self._volume_registration, None
            self._pool = self._registration = None
        if registration is not None:
            self.attachments.remove_handler(registration)
        if volume_registration is not None and self.volumes is not None:
            self.volumes.remove_handler(volume_registration)
        stopped = pool.stop(timeout=timeout) if pool is not None else True
        log.info("attacher stopped", extra=fields(clean=stopped))
        return stopped

    def _watch_volumes(self, work_queue: WorkQueue[str]) -> HandlerRegistration | None:
        takeover = self.takeover
        if takeover is None or self.volumes is None:
            return None

        def changed(pv: KubeObject) -> None:
            if takeover.wants_volume(pv):
                work_queue.add(legacy.PV_KEY_PREFIX + objects.name(pv))

        return self.volumes.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), resync_period=self.resync))

    def _process(self, name: str) -> None:
        with request_scope():
            if name.startswith(legacy.PV_KEY_PREFIX):
                pv = self.volumes.get(name[len(legacy.PV_KEY_PREFIX):]) if self.volumes is not None else None
                if pv is not None and self.takeover is not None:
                    self.takeover.sync_volume(pv)
                return
            attachment = self.attachments.get(name)
            if attachment is None or objects.spec(attachment).get("attacher") != self.driver_name:
                return
            self.strategy.sync(attachment)
            if self.takeover is not None:
                self.takeover.sync_attachment(attachment)
