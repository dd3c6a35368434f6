"""Topology: accessibility requirements for CreateVolume and the PV's node affinity (a simplified
external-provisioner GenerateAccessibilityRequirements). Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.errors import FailedPrecondition
from cephcsi.sidecars import objects

Segment = dict[str, str]


def topology_keys(csinode: Mapping[str, Any] | None, driver_name: str) -> list[str]:
    for driver in objects.spec(csinode or {}).get("drivers") or []:
        if driver.get("name") == driver_name:
            return list(driver.get("topologyKeys") or [])
    return []


def node_segment(node: Mapping[str, Any], keys: Sequence[str]) -> Segment:
    labels = objects.labels(node)
    missing = [k for k in keys if k not in labels]
    if missing:
        raise FailedPrecondition(
            f"node {objects.name(node)!r} lacks the topology label(s) {', '.join(missing)} its CSINode lists"
        )
    return {k: labels[k] for k in keys}


def allowed_segments(allowed_topologies: Iterable[Mapping[str, Any]]) -> list[Segment]:
    segments: list[Segment] = []
    for term in allowed_topologies:
        expressions = term.get("matchLabelExpressions") or []
        keys = [e.get("key", "") for e in expressions]
        for values in itertools.product(*[e.get("values") or [] for e in expressions]):
            segment = dict(zip(keys, values))
            if segment and segment not in segments:
                segments.append(segment)
    return segments


def requirement(driver_name: str, storage_class: Mapping[str, Any], selected: Mapping[str, Any] | None,
                selected_csinode: Mapping[str, Any] | None,
                all_nodes: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]] = ()) -> csi_pb2.TopologyRequirement | None:
    """The accessibility requirement, or None when there is no topology to ask for.

    `all_nodes` yields (node, csinode) pairs for the Immediate case without allowedTopologies."""
    if selected is not None:
        keys = topology_keys(selected_csinode, driver_name)
        if not keys:
            return None
        segments = [node_segment(selected, keys)]
    else:
        segments = allowed_segments(storage_class.get("allowedTopologies") or [])
        if not segments:
            for node, csinode in all_nodes:
                keys = topology_keys(csinode, driver_name)
                if keys and all(k in objects.labels(node) for k in keys):
                    segment = node_segment(node, keys)
                    if segment not in segments:
                        segments.append(segment)
        if not segments:
            return None
    topologies = [csi_pb2.Topology(segments=s) for s in segments]
    return csi_pb2.TopologyRequirement(requisite=topologies, preferred=topologies)


def node_affinity(accessible: Sequence[csi_pb2.Topology]) -> dict[str, Any] | None:
    """PV spec.nodeAffinity: one node selector term per accessible segment (ORed)."""
    terms = []
    for topology in accessible:
        expressions = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(topology.segments.items())]
        if expressions:
            terms.append({"matchExpressions": expressions})
    if not terms:
        return None
    return {"required": {"nodeSelectorTerms": terms}}
