"""The resizer's leader-only loop: claim events → one rate-limited work queue (key "namespace/name") →
ResizeWorker; one `start` → `stop` is one leadership term. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading

from cephcsi.kube.informer import EventHandler, HandlerRegistration
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers
from cephcsi.observability.logging import fields
from cephcsi.sidecars import kubeerrors, objects
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.resizer import modify_status, status
from cephcsi.sidecars.resizer.modifier import ModifyMemory, ModifyWorker
from cephcsi.sidecars.resizer.worker import FinalErrors, ResizeWorker, ResizerContext

log = logging.getLogger(__name__)


class ResizerLoop:
    def __init__(self, ctx: ResizerContext, *, workers: int, backoff: ItemBackoffSettings,
                 resync: float = 600.0) -> None:
        self.ctx = ctx
        self.workers = workers
        self.backoff = backoff
        self.resync = resync
        self.final_errors = FinalErrors()
        self._lock = threading.Lock()
        self.modify_memory = ModifyMemory()
        self._pool: Workers[str] | None = None
        self._modify_pool: Workers[str] | None = None
        self._registration: HandlerRegistration | None = None

    def start(self, stop: threading.Event) -> None:
        work_queue: WorkQueue[str] = WorkQueue("resizer", rate_limiter=ItemExponentialBackoff(self.backoff))
        worker = ResizeWorker(self.ctx, stop, self.final_errors)
        pool = Workers(work_queue, worker.process, count=self.workers, expected=kubeerrors.EXPLAINED)
        pool.start()

        # Class changes have their own queue and workers (external-resizer's modify
        # controller), so a slow expansion never holds up a modify or the reverse.
        modify_queue: WorkQueue[str] = WorkQueue("modifier", rate_limiter=ItemExponentialBackoff(self.backoff))
        modify_pool: Workers[str] | None = None
        if self.ctx.modify:
            modifier = ModifyWorker(self.ctx, stop, self.modify_memory)
            modify_pool = Workers(modify_queue, modifier.process, count=self.workers, expected=kubeerrors.EXPLAINED)
            modify_pool.start()

        def changed(claim: KubeObject) -> None:
            # Cheap filter on the cached claim; the worker checks the PV's driver.
            if status.needs_resize(claim):
                work_queue.add(objects.key(claim))
            if modify_pool is not None and modify_status.needs_modify(claim):
                modify_queue.add(objects.key(claim))

        registration = self.ctx.claims.add_handler(EventHandler(
            on_add=changed, on_update=lambda _old, new: changed(new), resync_period=self.resync))
        with self._lock:
            self._pool, self._registration, self._modify_pool = pool, registration, modify_pool
        log.info("resizer started", extra=fields(workers=self.workers, driver=self.ctx.driver_name))

    def stop(self, timeout: float) -> bool:
        with self._lock:
            pool, registration = self._pool, self._registration
            modify_pool = self._modify_pool
            self._pool = self._registration = self._modify_pool = None
        if registration is not None:
            self.ctx.claims.remove_handler(registration)
        stopped = pool.stop(timeout=timeout) if pool is not None else True
        if modify_pool is not None:
            stopped = modify_pool.stop(timeout=timeout) and stopped
        log.info("resizer stopped", extra=fields(clean=stopped))
        return stopped
