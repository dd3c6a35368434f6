"""The capacity loop (leader only): one CSIStorageCapacity object per (StorageClass of this driver,
topology segment) in the controller's namespace, holding GetCapacity's answer; "sync" and "poll"
work items on one queue and one worker. A failed item leaves its object as it was. Design:
docs/design/sidecars.md.
"""
from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.csi.controller import ControllerServicer
from cephcsi.errors import CephCSIError, Internal
from cephcsi.kube.informer import EventHandler, HandlerRegistration, Informer
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers
from cephcsi.observability.logging import fields
from cephcsi.sidecars import kubeerrors, objects
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.capacity import desired
from cephcsi.sidecars.capacity.api import CapacityApi
from cephcsi.sidecars.objects import KubeObject

log = logging.getLogger(__name__)

SYNC, POLL = "sync", "poll"


@dataclass
class CapacityContext:
    driver_name: str
    classes: Informer
    csinodes: Informer
    nodes: Informer
    capacities: Informer
    """Our CSIStorageCapacity objects: the controller's namespace, our labels (desired.label_selector)."""
    api: CapacityApi
    controller: ControllerServicer
    calls: CsiCalls
    find_owner: Callable[[], dict[str, Any] | None]
    """The owner reference objects get (--capacity-ownerref-level); looked up once, at the first
    reconcile, and retried with it: a failed lookup holds capacity tracking back, not the controller."""
    poll_interval: float = 60.0
    immediate_binding: bool = False


class CapacityLoop:
    def __init__(self, ctx: CapacityContext, *, backoff: ItemBackoffSettings) -> None:
        self.ctx = ctx
        self.backoff = backoff
        self._lock = threading.Lock()
        self._changed: set[str] = set()
        """Classes added or changed since the last sync: their objects get a fresh figure."""
        self._pool: Workers[str] | None = None
        self._queue: WorkQueue[str] | None = None
        self._stop = threading.Event()
        self._registrations: list[tuple[Informer, HandlerRegistration]] = []
        self._owner: dict[str, Any] | None = None
        self._owner_known = False

    # ---- one leadership term -----------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        work_queue: WorkQueue[str] = WorkQueue("capacity", rate_limiter=ItemExponentialBackoff(self.backoff))
        pool = Workers(work_queue, self._process, count=1, expected=kubeerrors.EXPLAINED)
        ctx = self.ctx

        def class_changed(storage_class: KubeObject) -> None:
            if storage_class.get("provisioner") == ctx.driver_name:
                with self._lock:
                    self._changed.add(objects.name(storage_class))
            work_queue.add(SYNC)

        def node_changed(old: KubeObject, new: KubeObject) -> None:
            if objects.labels(old) != objects.labels(new) or old is new:
                work_queue.add(SYNC)

        registrations = [
            (ctx.classes, ctx.classes.add_handler(EventHandler(
                on_add=class_changed, on_update=lambda _old, new: class_changed(new),
                on_delete=lambda _obj, _unknown: work_queue.add(SYNC)))),
            (ctx.nodes, ctx.nodes.add_handler(EventHandler(
                on_add=lambda _obj: work_queue.add(SYNC), on_update=node_changed,
                on_delete=lambda _obj, _unknown: work_queue.add(SYNC)))),
        ]
        for informer in (ctx.csinodes, ctx.capacities):
            registrations.append((informer, informer.add_handler(EventHandler(
                on_add=lambda _obj: work_queue.add(SYNC), on_update=lambda _old, _new: work_queue.add(SYNC),
                on_delete=lambda _obj, _unknown: work_queue.add(SYNC)))))
        with self._lock:
            self._pool, self._queue, self._stop = pool, work_queue, stop
            self._registrations = registrations
        pool.start()
        work_queue.add(SYNC)
        work_queue.add_after(POLL, ctx.poll_interval)
        log.info("capacity tracking started", extra=fields(poll_seconds=ctx.poll_interval, namespace=ctx.api.namespace))

    def stop(self, timeout: float) -> bool:
        with self._lock:
            pool, registrations = self._pool, self._registrations
            self._pool, self._queue, self._registrations = None, None, []
        for informer, registration in registrations:
            informer.remove_handler(registration)
        stopped = pool.stop(timeout=timeout) if pool is not None else True
        log.info("capacity tracking stopped", extra=fields(clean=stopped))
        return stopped

    # ---- work ----------------------------------------------------------------------------------

    def _process(self, key: str) -> None:
        if key == POLL:
            with self._lock:
                work_queue = self._queue
            if work_queue is not None:
                work_queue.add_after(POLL, self.ctx.poll_interval)  # the next poll, whatever this one does
            self.reconcile(refresh_all=True)
        else:
            self.reconcile(refresh_all=False)

    def owner(self) -> dict[str, Any] | None:
        if not self._owner_known:
            self._owner = self.ctx.find_owner()
            self._owner_known = True
            log.info("owner of CSIStorageCapacity objects", extra=fields(
                owner=f"{self._owner['kind']}/{self._owner['name']}" if self._owner else "none"))
        return self._owner

    def reconcile(self, *, refresh_all: bool) -> None:
        ctx = self.ctx
        owner = self.owner()
        with self._lock:
            changed, self._changed = self._changed, set()
        segments = desired.segments(ctx.driver_name, ctx.csinodes.list(), lambda name: ctx.nodes.get(name))
        wanted = desired.desired(ctx.classes.list(), segments, ctx.driver_name, ctx.immediate_binding)
        plan = desired.plan(wanted, ctx.capacities.list())
        failures: list[str] = []
        for capacity in plan.obsolete:
            ctx.api.delete(objects.name(capacity))
            log.info("CSIStorageCapacity deleted", extra=fields(
                name=objects.name(capacity), storage_class=capacity.get("storageClassName")))
        figures: dict[str, int] = {}  # one GetCapacity per class: a pool serves every segment alike
        for item, existing in sorted(plan.matched.items(), key=lambda pair: (pair[0].storage_class, pair[0].segment)):
            if existing is not None and not refresh_all and item.storage_class not in changed \
                    and desired.owned_by(existing, owner):
                continue
            try:
                if item.storage_class not in figures:
                    figures[item.storage_class] = self._available(item)
                self._write(item, existing, figures[item.storage_class], owner)
            except CephCSIError as error:
                failures.append(f"{item.storage_class}: {error.message}")
                if existing is None or refresh_all:
                    log.warning("capacity not written", extra=fields(
                        storage_class=item.storage_class, segment=item.labels, error=error.message))
                with self._lock:
                    if item.storage_class in changed:
                        self._changed.add(item.storage_class)  # still to refresh on the retry
        if failures:
            raise Internal(f"capacity of {len(failures)} object(s) not written: {'; '.join(failures)}")

    def _available(self, item: desired.Item) -> int:
        storage_class = self.ctx.classes.get(item.storage_class) or {}
        request = csi_pb2.GetCapacityRequest(
            parameters=dict(storage_class.get("parameters") or {}),
            accessible_topology=csi_pb2.Topology(segments=item.labels) if item.segment else None,
        )
        controller = self.ctx.controller
        response = self.ctx.calls.run("GetCapacity", f"capacity/{item.storage_class}",
                                      lambda: controller.GetCapacity(request, None), self._stop)
        return int(response.available_capacity)

    def _write(self, item: desired.Item, existing: Mapping[str, Any] | None, available: int,
               owner: dict[str, Any] | None) -> None:
        ctx = self.ctx
        if existing is None:
            created = ctx.api.create(desired.body(item, ctx.driver_name, available, owner))
            log.info("CSIStorageCapacity created", extra=fields(
                name=objects.name(created), storage_class=item.storage_class, segment=item.labels, capacity=available))
            return
        if desired.capacity_bytes(existing) == available and desired.owned_by(existing, owner):
            return
        updated = copy.deepcopy(dict(existing))
        updated["capacity"] = str(available)
        if owner is not None:
            updated["metadata"]["ownerReferences"] = [dict(owner)]
        ctx.api.update(updated)
        log.info("CSIStorageCapacity updated", extra=fields(
            name=objects.name(existing), storage_class=item.storage_class, capacity=available,
            previous=desired.capacity_bytes(existing)))
