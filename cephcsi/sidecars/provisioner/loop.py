"""The provisioner's leader-only loop: informer handlers feeding the claims and volumes work queues
and their workers; one `start` → `stop` is one leadership term. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading

from cephcsi.kube.informer import EventHandler, HandlerRegistration, Informer
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers
from cephcsi.observability.logging import fields
from cephcsi.sidecars import kubeerrors, objects
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner import claims, names
from cephcsi.sidecars.provisioner.context import ProvisionerContext
from cephcsi.sidecars.provisioner.delete import ATTACHED_PV_INDEX, VolumeWorker, attachment_pv_index, is_ours
from cephcsi.sidecars.provisioner.delete import settled as volume_settled
from cephcsi.sidecars.provisioner.provision import ClaimWorker
from cephcsi.sidecars.provisioner.static import is_static_pv

log = logging.getLogger(__name__)


class ProvisionerLoop:
    def __init__(self, ctx: ProvisionerContext, *, workers: int, backoff: ItemBackoffSettings,
                 resync: float = 600.0) -> None:
        self.ctx = ctx
        self.workers = workers
        self.backoff = backoff
        self.resync = resync
        ctx.attachments.add_indexers({ATTACHED_PV_INDEX: attachment_pv_index})
        self._registrations: list[tuple[Informer, HandlerRegistration]] = []
        self._pools: list[Workers[str]] = []
        self._lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        claim_queue: WorkQueue[str] = WorkQueue("provisioner-claims", rate_limiter=ItemExponentialBackoff(self.backoff))
        volume_queue: WorkQueue[str] = WorkQueue("provisioner-volumes", rate_limiter=ItemExponentialBackoff(self.backoff))
        claim_worker, volume_worker = ClaimWorker(self.ctx, stop), VolumeWorker(self.ctx, stop)
        pools = [Workers(claim_queue, claim_worker.process, count=self.workers, expected=kubeerrors.EXPLAINED),
                 Workers(volume_queue, volume_worker.process, count=self.workers, expected=kubeerrors.EXPLAINED)]
        for pool in pools:
            pool.start()
        registrations = [
            (self.ctx.claims, self.ctx.claims.add_handler(self._claim_handler(claim_queue, volume_queue))),
            (self.ctx.volumes, self.ctx.volumes.add_handler(self._volume_handler(volume_queue))),
            (self.ctx.classes, self.ctx.classes.add_handler(self._class_handler(claim_queue))),
            (self.ctx.attachments, self.ctx.attachments.add_handler(self._attachment_handler(volume_queue))),
        ]
        with self._lock:
            self._pools, self._registrations = pools, registrations
        log.info("provisioner started", extra=fields(workers=self.workers, driver=self.ctx.driver_name))

    def stop(self, timeout: float) -> bool:
        """Stop handlers and workers; True if every worker ended within timeout."""
        with self._lock:
            pools, registrations = self._pools, self._registrations
            self._pools, self._registrations = [], []
        for informer, registration in registrations:
            informer.remove_handler(registration)
        for pool in pools:
            pool.queue.shut_down()
        stopped = all([pool.stop(timeout=timeout) for pool in pools])
        log.info("provisioner stopped", extra=fields(clean=stopped))
        return stopped

    # ---- handlers (quick: they only queue keys) ------------------------------------------------

    def _claim_handler(self, claim_queue: WorkQueue[str], volume_queue: WorkQueue[str]) -> EventHandler:
        driver = self.ctx.driver_name

        def changed(claim: KubeObject) -> None:
            if claims.is_candidate(claim, driver) and not claims.settled(claim, driver):
                claim_queue.add(objects.key(claim))

        def deleted(claim: KubeObject, _unknown: bool) -> None:
            # A bound claim is gone: its PV may be deletable before the PV controller says Released.
            volume_queue.add(names.volume_name(objects.uid(claim)))

        return EventHandler(on_add=changed, on_update=lambda _old, new: changed(new), on_delete=deleted,
                            resync_period=self.resync)

    def _volume_handler(self, volume_queue: WorkQueue[str]) -> EventHandler:
        driver = self.ctx.driver_name

        def claim_uid(key: str) -> str | None:
            claim = self.ctx.claims.get(key)
            return objects.uid(claim) if claim is not None else None

        def changed(pv: KubeObject) -> None:
            if is_static_pv(pv, driver) or (is_ours(pv, driver) and not volume_settled(pv, claim_uid)):
                volume_queue.add(objects.name(pv))

        return EventHandler(on_add=changed, on_update=lambda _old, new: changed(new), resync_period=self.resync)

    def _class_handler(self, claim_queue: WorkQueue[str]) -> EventHandler:
        driver = self.ctx.driver_name

        def changed(storage_class: KubeObject) -> None:
            # Claims that failed for want of this class need not wait out their backoff.
            if storage_class.get("provisioner") != driver:
                return
            class_name = objects.name(storage_class)
            for claim in self.ctx.claims.list():
                if names.storage_class_name(claim) == class_name and claims.is_candidate(claim, driver) \
                        and not objects.spec(claim).get("volumeName"):
                    claim_queue.add(objects.key(claim))

        return EventHandler(on_add=changed, on_update=lambda old, new: changed(new) if old is not new else None)

    def _attachment_handler(self, volume_queue: WorkQueue[str]) -> EventHandler:
        def deleted(attachment: KubeObject, _unknown: bool) -> None:
            for pv_name in attachment_pv_index(attachment):
                volume_queue.add(pv_name)

        return EventHandler(on_delete=deleted)
