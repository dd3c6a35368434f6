"""The informer cache: keys, indexes, replace diffs."""
from __future__ import annotations

from typing import Any

import pytest

from cephcsi.kube.store import NAMESPACE_INDEX, Store, namespace_index, object_key, split_key

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def obj(name: str, namespace: str = "", rv: str = "1", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": rv, "labels": labels}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def by_label(label: str):  # type: ignore[no-untyped-def]
    return lambda o: [o["metadata"]["labels"][label]] if label in o["metadata"]["labels"] else []


def test_keys_for_namespaced_and_cluster_objects() -> None:
    assert object_key(obj("a", "ns")) == "ns/a"
    assert object_key(obj("pv1")) == "pv1"
    assert split_key("ns/a") == ("ns", "a")
    assert split_key("pv1") == ("", "pv1")


def test_indexes_follow_updates_and_deletes() -> None:
    store = Store({NAMESPACE_INDEX: namespace_index, "driver": by_label("driver")})
    store.upsert(obj("a", "ns1", driver="rbd"))
    store.upsert(obj("b", "ns1", driver="cephfs"))
    store.upsert(obj("c", "ns2", driver="rbd"))
    assert sorted(object_key(o) for o in store.by_index("driver", "rbd")) == ["ns1/a", "ns2/c"]
    assert sorted(store.index_keys(NAMESPACE_INDEX, "ns1")) == ["ns1/a", "ns1/b"]
    store.upsert(obj("a", "ns1", rv="2", driver="cephfs"))
    assert store.index_keys("driver", "rbd") == ["ns2/c"]
    store.delete("ns2/c")
    assert store.by_index("driver", "rbd") == []
    assert "rbd" not in store.index_values("driver")
    with pytest.raises(KeyError):
        store.by_index("missing", "x")


def test_indexer_added_later_covers_existing_objects() -> None:
    store = Store()
    store.upsert(obj("a", "ns", driver="rbd"))
    store.add_indexers({"driver": by_label("driver")})
    assert store.index_keys("driver", "rbd") == ["ns/a"]
    func = by_label("x")
    store.add_indexers({"x": func})
    store.add_indexers({"x": func})  # same function again: fine
    with pytest.raises(ValueError):
        store.add_indexers({"x": by_label("x")})


def test_failing_index_function_does_not_break_the_store() -> None:
    store = Store({"bad": lambda o: [o["metadata"]["nope"]]})
    store.upsert(obj("a", "ns"))
    assert store.get("ns/a") is not None
    assert store.index_values("bad") == []


def test_replace_reports_added_updated_deleted() -> None:
    store = Store()
    store.upsert(obj("keep", "ns", rv="1"))
    store.upsert(obj("change", "ns", rv="1"))
    store.upsert(obj("gone", "ns", rv="1"))
    result = store.replace([obj("keep", "ns", rv="1"), obj("change", "ns", rv="5"), obj("new", "ns", rv="6")])
    assert [object_key(o) for o in result.added] == ["ns/new"]
    assert [(old["metadata"]["resourceVersion"], new["metadata"]["resourceVersion"])
            for old, new in result.updated] == [("1", "5")]
    assert [object_key(o) for o in result.deleted] == ["ns/gone"]
    assert sorted(store.keys()) == ["ns/change", "ns/keep", "ns/new"]
    assert len(store) == 3 and "ns/keep" in store
