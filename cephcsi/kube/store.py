"""The informer's thread-safe, indexed local cache of API objects (plain dicts).

Objects are keyed "namespace/name" (or "name" for cluster-scoped objects). Extra indexes map an
index value to the keys of the objects whose index function returned it (e.g. "by-driver" or
"by-volume-handle" for PVs). Readers get the cached dicts themselves, not copies: they are shared
with every other reader and MUST be treated as read-only (deep-copy before building an update).
Copying on every read would cost more than the whole watch.
"""
from __future__ import annotations

import builtins
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

log = logging.getLogger(__name__)

KubeObject = dict[str, Any]
IndexFunc = Callable[[KubeObject], Iterable[str]]

NAMESPACE_INDEX = "namespace"


def object_key(obj: Mapping[str, Any]) -> str:
    """"namespace/name", or "name" for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") or ""
    name = meta.get("name") or ""
    return f"{namespace}/{name}" if namespace else str(name)


def split_key(key: str) -> tuple[str, str]:
    """(namespace, name) of a key; namespace is "" for cluster-scoped objects."""
    namespace, _, name = key.rpartition("/")
    return namespace, name


def namespace_index(obj: KubeObject) -> list[str]:
    """Index function: the object's namespace."""
    return [str((obj.get("metadata") or {}).get("namespace") or "")]


def resource_version(obj: Mapping[str, Any]) -> str:
    """metadata.resourceVersion or ""."""
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass
class ReplaceResult:
    """What a full replace changed, in the order handlers should hear about it."""

    added: list[KubeObject] = field(default_factory=list)
    """Objects that were not cached before."""
    updated: list[tuple[KubeObject, KubeObject]] = field(default_factory=list)
    """(old, new) pairs whose resourceVersion changed."""
    deleted: list[KubeObject] = field(default_factory=list)
    """Last known state of objects that are gone."""


class Store:
    """Thread-safe indexed cache; see the module docstring."""

    def __init__(self, indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self._lock = threading.RLock()
        self._items: dict[str, KubeObject] = {}
        self._indexers: dict[str, IndexFunc] = {}
        # index name -> index value -> set of keys
        self._indices: dict[str, dict[str, set[str]]] = {}
        if indexers:
            self.add_indexers(indexers)

    # ---- reads --------------------------------------------------------------------------------

    def get(self, key: str) -> KubeObject | None:
        """The cached object for key, or None."""
        with self._lock:
            return self._items.get(key)

    def list(self) -> list[KubeObject]:
        """All cached objects (a new list of shared objects)."""
        with self._lock:
            return list(self._items.values())

    def keys(self) -> builtins.list[str]:
        """All keys."""
        with self._lock:
            return list(self._items)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def by_index(self, index_name: str, value: str) -> builtins.list[KubeObject]:
        """Objects whose index function `index_name` returned `value`."""
        with self._lock:
            keys = self._index(index_name).get(value, ())
            return [self._items[k] for k in keys]

    def index_keys(self, index_name: str, value: str) -> builtins.list[str]:
        """Keys of the objects whose index function `index_name` returned `value`."""
        with self._lock:
            return list(self._index(index_name).get(value, ()))

    def index_values(self, index_name: str) -> builtins.list[str]:
        """Every value present in index `index_name`."""
        with self._lock:
            return list(self._index(index_name))

    # ---- writes (the informer's watch thread) ------------------------------------------------

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add indexes (and build them over the current content). Re-adding the same function
        under the same name is a no-op; a different function under a taken name is an error."""
        with self._lock:
            for name, func in indexers.items():
                existing = self._indexers.get(name)
                if existing is func:
                    continue
                if existing is not None:
                    raise ValueError(f"index {name!r} already exists with a different function")
                self._indexers[name] = func
                self._indices[name] = {}
                for key, obj in self._items.items():
                    self._index_one(name, func, key, obj)

    def upsert(self, obj: KubeObject) -> KubeObject | None:
        """Insert or replace obj; return the previous object for its key."""
        key = object_key(obj)
        with self._lock:
            old = self._items.get(key)
            if old is not None:
                self._unindex(key, old)
            self._items[key] = obj
            self._index_all(key, obj)
            return old

    def delete(self, key: str) -> KubeObject | None:
        """Remove key; return the object that was cached, if any."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._unindex(key, old)
            return old

    def replace(self, objects: Iterable[KubeObject]) -> ReplaceResult:
        """Make the content exactly `objects` (a fresh list) and report the difference.
        Objects whose resourceVersion did not change count as unchanged."""
        fresh = {object_key(obj): obj for obj in objects}
        result = ReplaceResult()
        with self._lock:
            for key in [k for k in self._items if k not in fresh]:
                old = self.delete(key)
                if old is not None:
                    result.deleted.append(old)
            for key, obj in fresh.items():
                old = self._items.get(key)
                if old is None:
                    self.upsert(obj)
                    result.added.append(obj)
                elif resource_version(old) != resource_version(obj):
                    self.upsert(obj)
                    result.updated.append((old, obj))
        return result

    # ---- internals ---------------------------------------------------------------------------------

    def _index(self, index_name: str) -> dict[str, set[str]]:
        try:
            return self._indices[index_name]
        except KeyError:
            raise KeyError(f"no index named {index_name!r}") from None

    def _index_all(self, key: str, obj: KubeObject) -> None:
        for name, func in self._indexers.items():
            self._index_one(name, func, key, obj)

    def _index_one(self, name: str, func: IndexFunc, key: str, obj: KubeObject) -> None:
        index = self._indices[name]
        for value in _values(name, func, obj):
            index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: KubeObject) -> None:
        for name, func in self._indexers.items():
            index = self._indices[name]
            for value in _values(name, func, obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]


def _values(name: str, func: IndexFunc, obj: KubeObject) -> list[str]:
    # A buggy index function must not kill the informer's watch thread.
    try:
        return list(func(obj))
    except Exception:  # noqa: BLE001
        log.exception("index function failed; object left out of the index",
                      extra={"fields": {"index": name, "key": object_key(obj)}})
        return []
