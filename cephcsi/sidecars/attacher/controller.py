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
from cephcsi.sidecars import objects
from cephcsi.sidecars.attacher.strategy import AttachStrategy
from cephcsi.sidecars.objects import KubeObject

log = logging.getLogger(__name__)


class AttacherLoop:
    def __init__(self, driver_name: str, attachments: Informer, strategy: AttachStrategy, *, workers: int,
                 backoff: ItemBackoffSettings, resync: float = 600.0) -> None:
        self.driver_name = driver_name
        self.attachments = attachments
        self.strategy = strategy
        self.workers = workers
        self.backoff = backoff
        self.resync = resync
        self._lock = threading.Lock()
        self._pool: Workers[str] | None = None
        self._registration: HandlerRegistration | None = None

    def start(self, stop: threading.Event) -> None:
        work_queue: WorkQueue[str] = WorkQueue("attacher", rate_limiter=ItemExponentialBackoff(self.backoff))
        pool = Workers(work_queue, self._process, count=self.workers)
        pool.start()

        def changed(attachment: KubeObject) -> None:
            if objects.spec(attachment).get("attacher") == self.driver_name:
                work_queue.add(objects.name(attachment))

        registration = self.attachments.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), resync_period=self.resync))
        with self._lock:
            self._pool, self._registration = pool, registration
        log.info("attacher started", extra=fields(strategy=self.strategy.name, workers=self.workers))

    def stop(self, timeout: float) -> bool:
        with self._lock:
            pool, registration = self._pool, self._registration
            self._pool = self._registration = None
        if registration is not None:
            self.attachments.remove_handler(registration)
        stopped = pool.stop(timeout=timeout) if pool is not None else True
        log.info("attacher stopped", extra=fields(clean=stopped))
        return stopped

    def _process(self, name: str) -> None:
        with request_scope():
            attachment = self.attachments.get(name)
            if attachment is None or objects.spec(attachment).get("attacher") != self.driver_name:
                return
            self.strategy.sync(attachment)
