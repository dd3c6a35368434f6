"""Which CSIStorageCapacity objects should exist, and which existing ones are ours (pure), labelled
as external-provisioner labels them. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from cephcsi.sidecars import objects

DRIVER_LABEL = "csi.storage.k8s.io/drivername"
MANAGED_BY_LABEL = "csi.storage.k8s.io/managed-by"
MANAGED_BY = "external-provisioner"
GENERATE_NAME = "csisc-"
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"

Segment = tuple[tuple[str, str], ...]
"""Topology labels, sorted by key."""


@dataclass(frozen=True)
class Item:
    storage_class: str
    segment: Segment

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.segment)


def label_selector(driver_name: str) -> str:
    """The objects this driver's capacity tracking owns."""
    return f"{DRIVER_LABEL}={driver_name},{MANAGED_BY_LABEL}={MANAGED_BY}"


def segments(driver_name: str, csinodes: Iterable[Mapping[str, Any]],
             node: Callable[[str], Mapping[str, Any] | None]) -> list[Segment]:
    """The distinct segments of the nodes where the driver is registered. A node missing one of
    its keys' labels is left out until its labels arrive (the kubelet may write the CSINode first)."""
    found: list[Segment] = []
    for csinode in csinodes:
        entry = next((d for d in objects.spec(csinode).get("drivers") or [] if d.get("name") == driver_name), None)
        if entry is None:
            continue
        current = node(objects.name(csinode))
        if current is None:
            continue
        keys = sorted(entry.get("topologyKeys") or [])
        labels = objects.labels(current)
        if any(key not in labels for key in keys):
            continue
        segment = tuple((key, labels[key]) for key in keys)
        if segment not in found:
            found.append(segment)
    return found


def tracked(storage_class: Mapping[str, Any], driver_name: str, immediate_binding: bool) -> bool:
    if storage_class.get("provisioner") != driver_name:
        return False
    # The API server defaults an unset volumeBindingMode to Immediate.
    return immediate_binding or storage_class.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER


def desired(classes: Iterable[Mapping[str, Any]], found: Iterable[Segment], driver_name: str,
            immediate_binding: bool) -> set[Item]:
    names = [objects.name(c) for c in classes if tracked(c, driver_name, immediate_binding)]
    return {Item(name, segment) for name in names for segment in found}


def item_of(capacity: Mapping[str, Any]) -> Item | None:
    """The item an existing object stands for; None for a selector we never write."""
    topology = capacity.get("nodeTopology") or {}
    if topology.get("matchExpressions"):
        return None
    labels = topology.get("matchLabels") or {}
    return Item(str(capacity.get("storageClassName") or ""), tuple(sorted(labels.items())))


@dataclass
class Plan:
    matched: dict[Item, Mapping[str, Any] | None] = field(default_factory=dict)
    """Every wanted item, with its existing object (None: to be created)."""
    obsolete: list[Mapping[str, Any]] = field(default_factory=list)
    """Ours but not wanted (class or segment gone, or a duplicate): to be deleted."""


def plan(wanted: Iterable[Item], existing: Iterable[Mapping[str, Any]]) -> Plan:
    result = Plan(matched={item: None for item in wanted})
    for capacity in sorted(existing, key=objects.name):
        item = item_of(capacity)
        if item is not None and item in result.matched and result.matched[item] is None:
            result.matched[item] = capacity
        else:
            result.obsolete.append(capacity)
    return result


def capacity_bytes(capacity: Mapping[str, Any]) -> int | None:
    value = capacity.get("capacity")
    if value is None:
        return None
    return int(parse_quantity(value))


def owned_by(capacity: Mapping[str, Any], owner: Mapping[str, Any] | None) -> bool:
    if owner is None:
        return True
    refs = objects.meta(capacity).get("ownerReferences") or []
    return any(ref.get("uid") == owner["uid"] and ref.get("controller") for ref in refs)


def body(item: Item, driver_name: str, available: int, owner: Mapping[str, Any] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"generateName": GENERATE_NAME,
                                "labels": {DRIVER_LABEL: driver_name, MANAGED_BY_LABEL: MANAGED_BY}}
    if owner is not None:
        metadata["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity", "metadata": metadata,
            "storageClassName": item.storage_class, "nodeTopology": {"matchLabels": item.labels},
            "capacity": str(available)}
