"""The informers' projection (cephcsi.kube.projection): what it drops, that it changes no other
value a loop can read, that it shares equal pieces, and that its pools stay bounded."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from bench import scale_memory, scale_model
from cephcsi.kube.projection import LAST_APPLIED, Projection

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def _listed(kind: str, i: int) -> dict[str, Any]:
    obj = scale_memory.KINDS[kind](i)
    obj["kind"] = kind
    obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = '{"big": "copy"}'
    obj["metadata"].setdefault("labels", {})["app"] = "db"
    return obj


def _node(i: int) -> dict[str, Any]:
    node = scale_model.node_body(i)
    node["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    node["status"] = {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.31"},
                      "addresses": [{"type": "InternalIP", "address": f"10.0.0.{i}"}],
                      "images": [{"names": ["quay.io/ceph/ceph:v19"], "sizeBytes": 1 << 30}]}
    return node


def _without_dropped(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("managedFields", None)
    out["metadata"].get("annotations", {}).pop(LAST_APPLIED, None)
    if out.get("kind") == "Node":
        out.get("status", {}).pop("images", None)
    return out


def _kind_maker(kind: str) -> Callable[[int], dict[str, Any]]:
    return lambda i: _listed(kind, i)


def _storage_class(i: int) -> dict[str, Any]:
    return {"kind": "StorageClass", "apiVersion": "storage.k8s.io/v1",
            "metadata": {"name": f"sc-{i}", "managedFields": [{}]},
            "provisioner": scale_model.DRIVER, "parameters": {"pool": "rbd"}}


def _csinode(i: int) -> dict[str, Any]:
    body: dict[str, Any] = dict(scale_model.csinode_body(i))
    body["metadata"] = {"name": f"n{i}", "managedFields": [{}]}
    return body


OBJECTS: dict[str, Callable[[int], dict[str, Any]]] = {kind: _kind_maker(kind) for kind in scale_memory.KINDS}
OBJECTS.update(Node=_node, StorageClass=_storage_class, CSINode=_csinode)


@pytest.mark.parametrize("kind", sorted(OBJECTS))
def test_every_field_but_the_dropped_ones_keeps_its_value(kind: str) -> None:
    # Equal JSON before and after (less the dropped fields) means every accessor a loop runs on
    # the cached object returns what it returned on the object the API server sent.
    projection = Projection()
    for i in range(3):
        original = OBJECTS[kind](i)
        projected = copy.deepcopy(original)
        projection(projected)
        assert projected == _without_dropped(original)
        assert "managedFields" not in projected["metadata"]
        assert LAST_APPLIED not in projected["metadata"].get("annotations", {})


def test_equal_pieces_of_different_claims_are_one_object() -> None:
    projection = Projection()
    a, b = _listed("PersistentVolume", 1), _listed("PersistentVolume", 2)
    projection(a)
    projection(b)
    for path in (("metadata", "annotations"), ("metadata", "finalizers"), ("spec", "accessModes"),
                 ("spec", "capacity"), ("spec", "csi", "nodeStageSecretRef")):
        x: Any = a
        y: Any = b
        for part in path:
            x, y = x[part], y[part]
        assert x is y, path
    assert a["spec"]["csi"]["driver"] is b["spec"]["csi"]["driver"]
    assert a["spec"]["csi"]["volumeAttributes"]["pool"] is b["spec"]["csi"]["volumeAttributes"]["pool"]
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert a["spec"]["claimRef"] is not b["spec"]["claimRef"]


def test_a_volume_status_is_pooled_only_without_its_per_volume_time() -> None:
    projection = Projection()
    a, b = _listed("PersistentVolume", 1), _listed("PersistentVolume", 2)
    for item in (a, b):
        item["status"].pop("lastPhaseTransitionTime", None)
        projection(item)
    assert a["status"] is b["status"]
    timed = [_listed("PersistentVolume", n) for n in (3, 4)]
    for item in timed:
        assert "lastPhaseTransitionTime" in item["status"]
        projection(item)
    assert timed[0]["status"] is not timed[1]["status"], "a status that never repeats stays out of the capped pool"
    assert timed[0]["status"] == timed[1]["status"]


def test_json_types_are_not_conflated() -> None:
    # True == 1 in Python: a pool keyed by value alone would hand {"x": 1} to {"x": True}.
    projection = Projection()
    first: dict[str, Any] = {"kind": "VolumeAttachment", "metadata": {"name": "a"}, "status": {"attached": 1}}
    second: dict[str, Any] = {"kind": "VolumeAttachment", "metadata": {"name": "b"}, "status": {"attached": True}}
    projection(first)
    projection(second)
    assert second["status"]["attached"] is True
    assert first["status"] is not second["status"]


def test_pools_stay_within_the_cap_for_objects_that_never_repeat() -> None:
    projection = Projection(cap=50)
    objects = []
    for i in range(500):
        obj: dict[str, Any] = {"kind": "PersistentVolumeClaim", "metadata": {"name": f"c{i}", "namespace": f"ns-{i}",
                                                            "annotations": {"unique": f"v{i}"}}}
        projection(obj)
        objects.append(obj)
    assert len(projection._texts) <= 50 and len(projection._containers) <= 50
    assert objects[499]["metadata"] == {"name": "c499", "namespace": "ns-499", "annotations": {"unique": "v499"}}


def test_what_is_dropped_is_read_by_no_loop() -> None:
    # The projection's promise: no code outside cephcsi/kube reads a field it drops.
    # (A read of "images": .get("images") or ["images"] not followed by an assignment.)
    dropped = re.compile(r"managedFields|last-applied-configuration|\.get\([\"']images[\"']|\[[\"']images[\"']\](?!\s*=)")
    readers = [str(path.relative_to(ROOT)) for path in (ROOT / "cephcsi").rglob("*.py")
               if path.parent.name != "kube" and any(dropped.search(line) and "pop(" not in line and "in (" not in line
                                                     for line in path.read_text().splitlines())]
    assert readers == []


def test_the_projection_halves_the_bytes_per_claim() -> None:
    rows = scale_memory.table(objects=500)
    before, after = sum(r[1] for r in rows), sum(r[2] for r in rows)
    assert after < 0.6 * before, rows
