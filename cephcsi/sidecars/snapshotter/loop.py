"""The snapshotter's leader-only loop: VolumeSnapshotContent events → one work queue → workers. Its
informer is its own and starts only once discovery serves VolumeSnapshotContents; start and stop
never block on that wait. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cephcsi.errors import CephCSIError
from cephcsi.kube.informer import EventHandler, HandlerRegistration
from cephcsi.kube.ratelimit import ItemBackoffSettings, ItemExponentialBackoff
from cephcsi.kube.workqueue import WorkQueue, Workers
from cephcsi.observability.logging import fields
from cephcsi.sidecars import kubeerrors, objects
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.snapshotter.api import GROUP
from cephcsi.sidecars.snapshotter.content import ContentWorker, SnapshotterContext, only_own_bookkeeping, ours

log = logging.getLogger(__name__)

# Seconds between discovery checks while the snapshot CRDs are not installed.
DISCOVERY_INTERVAL = 30.0
# How often a waiting term looks at its stop event while the informer syncs.
_POLL = 0.2


class SnapshotterLoop:
    """Also the group snapshotter's loop (`cephcsi.sidecars.groupsnapshotter.loop`), which
    replaces the hooks below: what it is called, which contents are its own and how one is
    handled."""

    loop_name = "snapshotter"
    group = GROUP
    crds = "snapshot CRDs"
    crds_hint = "kubernetes-csi/external-snapshotter client/config/crd"
    # A cluster without the CRDs cannot take snapshots at all: a warning.
    missing_level = logging.WARNING

    def __init__(self, ctx: SnapshotterContext, *, workers: int, backoff: ItemBackoffSettings,
                 resync: float = 600.0, discovery_interval: float = DISCOVERY_INTERVAL) -> None:
        self.ctx = ctx
        self.workers = workers
        self.backoff = backoff
        self.resync = resync
        self.discovery_interval = discovery_interval
        self._served = False  # discovery has listed VolumeSnapshotContents (no more checks)
        self._warned = False  # "CRDs not installed" logged (once per process)
        self._registration: HandlerRegistration | None = None
        self._pool: Workers[str] | None = None
        self._lock = threading.Lock()
        self._waiter: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        """Returns at once: a thread waits for the CRDs, starts the informer (once) and, when it
        has synced, the workers of this term."""
        self._waiter = threading.Thread(target=self._start_when_synced, args=(stop,), name=f"{self.loop_name}-sync",
                                        daemon=True)
        self._waiter.start()

    def _start_when_synced(self, stop: threading.Event) -> None:
        if not self._wait_for_crds(stop):
            return
        with self._lock:
            if stop.is_set():
                return
            self.ctx.contents.start()
        while not self.ctx.contents.wait_for_sync(_POLL):
            if stop.is_set() or self.ctx.contents.stopped:
                return
        with self._lock:
            if stop.is_set():
                return
            self._start_workers(stop)

    def _wait_for_crds(self, stop: threading.Event) -> bool:
        """True once discovery serves the contents; False if the term ends first."""
        while not stop.is_set():
            if self._served:
                return True
            try:
                served = self.ctx.snapshots.served()
            except CephCSIError as error:
                log.warning(f"cannot check whether the {self.crds} are installed; checking again later",
                            extra=fields(group=self.group, error=error.message,
                                         retry_in=self.discovery_interval))
            else:
                if served:
                    if self._warned:
                        log.info(f"{self.crds} installed; {self.loop_name} starting",
                                 extra=fields(group=self.group))
                    self._served = True
                    return True
                if not self._warned:
                    self._warned = True
                    log.log(self.missing_level, f"{self.crds} not installed; {self.loop_name} idle until they are "
                            f"({self.crds_hint})",
                            extra=fields(group=self.group, recheck_every=self.discovery_interval))
            stop.wait(self.discovery_interval)
        return False

    def _start_workers(self, stop: threading.Event) -> None:
        queue: WorkQueue[str] = WorkQueue(f"{self.loop_name}-contents", rate_limiter=ItemExponentialBackoff(self.backoff))
        pool = Workers(queue, self._worker(stop), count=self.workers, expected=kubeerrors.EXPLAINED)
        pool.start()
        driver = self.ctx.driver_name

        def changed(content: KubeObject) -> None:
            if ours(content, driver):
                queue.add(objects.name(content))

        def updated(old: KubeObject, new: KubeObject) -> None:
            # `old is new` is a resync: always worth a pass.
            if old is new or not self._only_own_bookkeeping(old, new):
                changed(new)

        self._registration = self.ctx.contents.add_handler(EventHandler(
            on_add=changed, on_update=updated, resync_period=self.resync))
        self._pool = pool
        log.info(f"{self.loop_name} started", extra=fields(workers=self.workers, driver=driver))

    def _worker(self, stop: threading.Event) -> Callable[[str], None]:
        """What one work item (a content name) runs."""
        return ContentWorker(self.ctx, stop).process

    def _only_own_bookkeeping(self, old: KubeObject, new: KubeObject) -> bool:
        return only_own_bookkeeping(old, new)

    def stop(self, timeout: float) -> bool:
        """End this term's handler and workers (the informer keeps running for the next)."""
        waiter = self._waiter
        if waiter is not None:
            # It notices `stop` within _POLL (or once a discovery GET returns) and never starts
            # workers once stop is set (checked under the lock), so a short join is enough.
            waiter.join(timeout=min(timeout, 1.0))
        with self._lock:
            pool, registration = self._pool, self._registration
            self._pool, self._registration = None, None
        if registration is not None:
            self.ctx.contents.remove_handler(registration)
        if pool is None:
            return True
        pool.queue.shut_down()
        stopped = pool.stop(timeout=timeout)
        log.info(f"{self.loop_name} stopped", extra=fields(clean=stopped))
        return stopped

    def close(self, timeout: float = 5.0) -> None:
        """Stop the informer (process shutdown)."""
        self.ctx.contents.stop(timeout)
