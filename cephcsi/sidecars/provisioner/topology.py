"""Topology: accessibility requirements for CreateVolume, built as external-provisioner builds them
(with its --strict-topology and --immediate-topology), and the PV's node affinity.
Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.errors import FailedPrecondition, Unavailable
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
    """allowedTopologies as segments: each term's values distributed over its keys."""
    segments: list[Segment] = []
    for term in allowed_topologies:
        expressions = term.get("matchLabelExpressions") or []
        keys = [e.get("key", "") for e in expressions]
        for values in itertools.product(*[e.get("values") or [] for e in expressions]):
            segment = dict(zip(keys, values))
            if segment and segment not in segments:
                segments.append(segment)
    return segments


@dataclass(frozen=True)
class TopologyPolicy:
    """external-provisioner's --strict-topology and --immediate-topology."""

    strict: bool = False
    """Delayed binding asks for the selected node's segment only (else every segment, the node's first)."""
    immediate: bool = True
    """Immediate binding without allowedTopologies asks for every node's segment (else for nothing)."""


def _covers(general: Segment, specific: Segment) -> bool:
    return all(specific.get(k) == v for k, v in general.items())


def _ordered(segments: Iterable[Segment]) -> list[Segment]:
    """Deduplicated in a fixed order (fewest keys first, then by pairs), so that every replica and
    retry sends the same list."""
    unique = {tuple(sorted(s.items())): s for s in segments if s}
    return [dict(pairs) for pairs in sorted(unique, key=lambda pairs: (len(pairs), pairs))]


def _every_node(keys: Sequence[str], nodes: Iterable[Mapping[str, Any]]) -> list[Segment]:
    return [node_segment(n, keys) for n in nodes if all(k in objects.labels(n) for k in keys)]


_ORDINAL = re.compile(r"[0-9]+")


def _spread_offset(claim_name: str) -> int:
    """Where an Immediate claim's preferred list starts: a StatefulSet's claims
    (`<claim>-<set>-<ordinal>`) rotate by ordinal from a hash of the set's name, so its members
    spread over the segments while one member's claims stay together; as Kubernetes does (FNV-1)."""
    base, ordinal = claim_name, 0
    prefix, dash, suffix = claim_name.rpartition("-")
    if dash and _ORDINAL.fullmatch(suffix) and int(suffix) <= 0xFFFFFFFF:
        base, ordinal = prefix.rpartition("-")[2], int(suffix)
    digest = 0x811C9DC5
    for byte in base.encode():
        digest = (digest * 0x01000193) & 0xFFFFFFFF
        digest ^= byte
    return (digest + ordinal) & 0xFFFFFFFF


def _rotated(segments: list[Segment], first: int) -> list[Segment]:
    return segments[first:] + segments[:first]


def _topologies(segments: Iterable[Segment]) -> list[csi_pb2.Topology]:
    return [csi_pb2.Topology(segments=s) for s in segments]


def requirement(driver_name: str, storage_class: Mapping[str, Any], selected: Mapping[str, Any] | None,
                selected_csinode: Mapping[str, Any] | None,
                all_nodes: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]] = (),
                policy: TopologyPolicy = TopologyPolicy(), claim_name: str = "") -> csi_pb2.TopologyRequirement | None:
    """The accessibility requirement of a claim as external-provisioner builds it, or None when
    there is none to ask for. `selected` is the node a WaitForFirstConsumer claim waits for;
    `all_nodes` yields the (node, csinode) pairs of the cluster, read only where needed."""
    allowed = allowed_segments(storage_class.get("allowedTopologies") or [])
    if selected is not None:
        name = objects.name(selected)
        keys = topology_keys(selected_csinode, driver_name)
        if not keys:
            # The node plugin has not registered there (yet), or runs without --domainlabels:
            # guessing a segment could put the volume where that node cannot reach it.
            raise Unavailable(f"node {name!r} has no topology keys for {driver_name} in its CSINode: its node "
                              f"plugin has not registered yet or runs without --domainlabels")
        chosen = node_segment(selected, keys)
        if policy.strict:
            if allowed and not any(_covers(a, chosen) for a in allowed):
                raise FailedPrecondition(f"node {name!r} is in {chosen}, outside the StorageClass's "
                                         f"allowedTopologies {allowed}")
            return csi_pb2.TopologyRequirement(requisite=_topologies([chosen]), preferred=_topologies([chosen]))
        requisite = _ordered(allowed or _every_node(keys, (n for n, _ in all_nodes)) or [chosen])
        first = next((i for i, s in enumerate(requisite) if _covers(s, chosen)), None)
        if first is None:
            raise FailedPrecondition(f"node {name!r} is in {chosen}, which none of the segments the claim may use "
                                     f"covers: {requisite}")
        return csi_pb2.TopologyRequirement(requisite=_topologies(requisite),
                                           preferred=_topologies(_rotated(requisite, first)))
    if allowed:
        requisite = _ordered(allowed)
    elif not policy.immediate:
        return None
    else:
        pairs = list(all_nodes)
        keys = next((k for _, csinode in pairs if (k := topology_keys(csinode, driver_name))), [])
        requisite = _ordered(_every_node(keys, (n for n, _ in pairs))) if keys else []
        if not requisite:
            raise Unavailable(f"no node has registered topology keys for {driver_name} yet (node plugins "
                              f"without --domainlabels?); an Immediate claim waits for one, as external-provisioner")
    first = _spread_offset(claim_name) % len(requisite)
    return csi_pb2.TopologyRequirement(requisite=_topologies(requisite),
                                       preferred=_topologies(_rotated(requisite, first)))


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
