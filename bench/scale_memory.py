"""Bytes per cached object: the scale section's seeded claims as the API server lists them
(uid, resourceVersion, creationTimestamp and managedFields added), decoded page by page as the
reflector does, with and without the informers' projection (cephcsi.kube.projection), measured
with tracemalloc. `python -m bench.scale_memory [objects]` prints the table.
"""
from __future__ import annotations

import copy
import sys
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from bench import scale_model as model
from cephcsi.kube.projection import Projection

PAGE = 500
SEED = model.Seed(namespace="scale-claims", storage_class="scale-3f9c2a", secret=("scale-secrets", "csi-rbd-secret"),
                  cluster_id="0e4b5f8a-8d4e-4d0a-9a53-4c1f1d1f2c11", pool="rbd",
                  attacher_finalizer="external-attacher/rbd-csi-ceph-com")


def _managed_fields(manager: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-11-27T12:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": fields}]


def as_listed(body: dict[str, Any], status: dict[str, Any], i: int) -> dict[str, Any]:
    """`body` + `status` with what the API server adds to a stored object."""
    obj = copy.deepcopy(body)
    meta = obj["metadata"]
    meta["uid"] = str(uuid.UUID(int=i + 1))
    meta["resourceVersion"] = str(100000 + 7 * i)
    meta["creationTimestamp"] = f"2026-11-27T12:{i // 200 % 60:02d}:{i // 3 % 60:02d}Z"
    meta["managedFields"] = _managed_fields("scale-seed", {"f:metadata": {"f:annotations": {".": {}}},
                                                           "f:spec": {k: {} for k in obj.get("spec", {})}})
    obj.update(copy.deepcopy(status))
    del obj["kind"], obj["apiVersion"]  # list items carry neither
    return obj


KINDS: dict[str, Callable[[int], dict[str, Any]]] = {
    "PersistentVolumeClaim": lambda i: as_listed(model.pvc_body(SEED, i), model.pvc_status(), i),
    "PersistentVolume": lambda i: as_listed(model.pv_body(SEED, i, str(uuid.UUID(int=10**9 + i))),
                                            {"status": {"phase": "Bound",
                                                        "lastPhaseTransitionTime": "2026-11-27T12:00:01Z"}}, i),
    "VolumeAttachment": lambda i: as_listed(model.attachment_body(SEED, i), model.attachment_status(), i),
}


def pages(kind: str, objects: int) -> list[bytes]:
    """The list response bodies of `objects` objects of `kind`, PAGE per page."""
    make = KINDS[kind]
    out = []
    for start in range(0, objects, PAGE):
        items = [make(i) for i in range(start, min(objects, start + PAGE))]
        out.append(orjson.dumps({"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items}))
    return out


def bytes_per_object(kind: str, objects: int, project: bool) -> float:
    """Bytes tracemalloc counts for the cached objects (and the projection's pools), per object.
    Without `project` only managedFields is dropped (the cache before the projection)."""
    raw = pages(kind, objects)
    tracemalloc.start()
    try:
        projection = Projection() if project else None
        cache = []
        for page in raw:
            for item in orjson.loads(page)["items"]:
                item["kind"] = kind
                if projection is not None:
                    projection(item)
                else:
                    item["metadata"].pop("managedFields", None)
                cache.append(item)
        used = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return used / objects


def table(objects: int = 2000) -> list[tuple[str, float, float]]:
    """(kind, bytes per object before, after) for each seeded kind."""
    return [(kind, bytes_per_object(kind, objects, False), bytes_per_object(kind, objects, True)) for kind in KINDS]


def main(argv: list[str]) -> None:
    objects = int(argv[0]) if argv else 2000
    rows = table(objects)
    print(f"| kind | bytes per cached object before | after | after / before |  ({objects:,} objects)")
    for kind, before, after in rows:
        print(f"| {kind} | {before:,.0f} | {after:,.0f} | {after / before:.2f}× |")
    before, after = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"| per claim (all three) | {before:,.0f} | {after:,.0f} | {after / before:.2f}× |")


if __name__ == "__main__":
    main(sys.argv[1:])
