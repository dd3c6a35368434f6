"""Informer: a local cache of one resource kept in sync by `reflector.Reflector`, with one
notification per change queued under the cache's lock (delivered by `handlers.Dispatcher`).
`has_synced()` is true once the first list is cached and its adds delivered. Cached dicts are
shared: read-only; deep-copy before changing. Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import builtins
import logging
import threading
import time
from typing import Mapping

from cephcsi.kube.handlers import DispatchLoop, Dispatcher, EventHandler, HandlerRegistration, Note, enqueue_handler
from cephcsi.kube.metrics import INFORMER_ITEMS
from cephcsi.kube.reflector import InformerSettings, ListFunc, RawResponse, Reflector, Selectors
from cephcsi.kube.store import IndexFunc, KubeObject, Store, object_key

__all__ = ["EventHandler", "HandlerRegistration", "Informer", "InformerSettings", "ListFunc", "RawResponse",
           "enqueue_handler"]

log = logging.getLogger(__name__)


class Informer:
    """List+watch one resource into a Store and notify handlers; docs/design/kubernetes-machinery.md."""

    def __init__(self, list_func: ListFunc, *, name: str, settings: InformerSettings = InformerSettings(),
                 indexers: Mapping[str, IndexFunc] | None = None, label_selector: str | None = None,
                 field_selector: str | None = None, dispatch_loop: DispatchLoop | None = None) -> None:
        """`dispatch_loop`: the handler thread shared with other informers (the factory's); None
        gives this informer a thread of its own."""
        self.name = name
        self.settings = settings
        self._store = Store(indexers)
        self._lock = threading.Lock()
        self._dispatcher = Dispatcher(name, self._store, dispatch_loop)
        self._stop = threading.Event()
        self._listed = False  # first list cached and its "synced" note queued (under _lock)
        self._started = False
        self._threads: list[threading.Thread] = []
        self._reflector = Reflector(list_func, self, name=name, settings=settings,
                                    selectors=Selectors(label_selector, field_selector), stop=self._stop)

    # ---- cache reads --------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The cache (read it; only the informer writes it)."""
        return self._store

    def get(self, key: str) -> KubeObject | None:
        """Cached object by "namespace/name" (or "name"), or None. Read-only."""
        return self._store.get(key)

    def get_by_name(self, namespace: str, name: str) -> KubeObject | None:
        """Cached object by namespace ("" for cluster-scoped) and name, or None. Read-only."""
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self) -> list[KubeObject]:
        """Every cached object. Read-only."""
        return self._store.list()

    def by_index(self, index_name: str, value: str) -> builtins.list[KubeObject]:
        """Cached objects with `value` in index `index_name`. Read-only."""
        return self._store.by_index(index_name, value)

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add named indexes (allowed before or after start)."""
        self._store.add_indexers(indexers)

    @property
    def last_sync_resource_version(self) -> str:
        """resourceVersion of the last list, watch event or bookmark."""
        return self._reflector.last_rv

    # ---- handlers ---------------------------------------------------------------------------------

    def add_handler(self, handler: EventHandler) -> HandlerRegistration:
        """Register handler; it first receives an add for every object already cached."""
        period = handler.resync_period if handler.resync_period is not None else self.settings.resync_period
        reg = HandlerRegistration(handler, period)
        with self._lock:
            existing = self._store.list()
            self._dispatcher.registrations = self._dispatcher.registrations + (reg,)
            for obj in existing:
                self._dispatcher.post(Note("add", (reg,), new=obj))
            if self._listed:
                self._dispatcher.post(Note("handler_synced", (reg,)))
        return reg

    def remove_handler(self, reg: HandlerRegistration) -> None:
        """Stop delivering to this handler."""
        with self._lock:
            reg.removed = True
            self._dispatcher.registrations = tuple(r for r in self._dispatcher.registrations if r is not reg)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the watch thread and the handlers' delivery (idempotent)."""
        if self._started:
            return
        self._started = True
        self._dispatcher.start()
        thread = threading.Thread(target=self._reflector.run, name=f"informer-{self.name}-watch", daemon=True)
        self._threads.append(thread)
        thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the watch and the handlers; wait up to `timeout` seconds for both."""
        self._stop.set()
        self._reflector.interrupt()
        self._dispatcher.stop()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._dispatcher.done.wait(max(0.0, deadline - time.monotonic()))

    @property
    def stopped(self) -> bool:
        """True once stop() was called."""
        return self._stop.is_set()

    def has_synced(self) -> bool:
        """True once the first list is cached and delivered to the handlers present then."""
        return self._dispatcher.synced.is_set()

    def wait_for_sync(self, timeout: float) -> bool:
        """Block until has_synced() or timeout (or stop); return has_synced()."""
        synced = self._dispatcher.synced
        deadline = time.monotonic() + timeout
        while not synced.is_set() and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            synced.wait(min(remaining, 0.1))
        return synced.is_set()

    # ---- the reflector's sink (watch thread) ------------------------------------------------------

    def replace(self, items: builtins.list[KubeObject], resource_version: str) -> None:
        """A complete list arrived: diff it into the cache and notify what changed."""
        with self._lock:
            result = self._store.replace(items)
            targets = self._dispatcher.registrations
            for obj in result.added:
                self._dispatcher.post(Note("add", targets, new=obj))
            for old, new in result.updated:
                self._dispatcher.post(Note("update", targets, old=old, new=new))
            for old in result.deleted:
                self._dispatcher.post(Note("delete", targets, old=old, unknown=True))
            if not self._listed:
                self._listed = True
                self._dispatcher.post(Note("synced", targets))
        INFORMER_ITEMS.labels(self.name).set(len(self._store))
        log.info("listed", extra={"fields": {"informer": self.name, "items": len(items),
                                             "resource_version": resource_version, "added": len(result.added),
                                             "updated": len(result.updated), "deleted": len(result.deleted)}})

    def apply(self, event_type: str, obj: KubeObject) -> None:
        """One watch event: update the cache and notify."""
        with self._lock:
            targets = self._dispatcher.registrations
            if event_type == "DELETED":
                self._store.delete(object_key(obj))
                self._dispatcher.post(Note("delete", targets, old=obj, unknown=False))
            else:
                old = self._store.upsert(obj)
                if old is None:
                    self._dispatcher.post(Note("add", targets, new=obj))
                else:
                    self._dispatcher.post(Note("update", targets, old=old, new=obj))
        INFORMER_ITEMS.labels(self.name).set(len(self._store))
