"""`topologyConstrainedPools`: which pool a new volume goes to, given the CO's accessibility
requirements. Pure: parsing, validation and matching only (cephcsi.volumes.placement reads the
journals). Matching follows ceph-csi's rules (keys compared after their first '/', preferred
then requisite, pools in listed order; the matching requirement's segments are answered):
docs/topology.md."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cephcsi.errors import InvalidArgument, ResourceExhausted

KEY = "topologyConstrainedPools"

Segments = Mapping[str, str]


@dataclass(frozen=True)
class TopologyPool:
    pool: str
    data_pool: str
    segments: tuple[tuple[str, str], ...]
    """(domainLabel, value) pairs, all of which a requirement must have."""

    def matches(self, segments: Segments) -> bool:
        domains = {key.split("/", 1)[-1]: value for key, value in segments.items()}
        return all(domains.get(label) == value for label, value in self.segments)


@dataclass(frozen=True)
class Requirements:
    """A CreateVolume's accessibility requirements: topologies as segment maps."""

    preferred: tuple[Segments, ...] = ()
    requisite: tuple[Segments, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.preferred and not self.requisite


@dataclass(frozen=True)
class Match:
    pool: TopologyPool
    segments: dict[str, str]
    """The requirement topology the pool matched: the volume's accessible topology."""


def _bad(why: str) -> InvalidArgument:
    return InvalidArgument(
        f"parameter {KEY}: {why}; expected a JSON list like "
        '[{"poolName": "pool-a", "dataPool": "", "domainSegments": [{"domainLabel": "zone", "value": "a"}]}]'
    )


def _text(entry: Mapping[str, object], key: str, where: str, required: bool = True) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or (required and not value):
        raise _bad(f"{where}.{key} must be a non-empty string" if required else f"{where}.{key} must be a string")
    return value


def parse(text: str) -> tuple[TopologyPool, ...]:
    """The parameter's pools; InvalidArgument naming the first thing wrong. Unlike ceph-csi,
    which parses it only when a request carries requirements, a bad value is refused on every
    CreateVolume, so a class cannot work for Immediate claims and fail for the first
    WaitForFirstConsumer one."""
    try:
        # ceph-csi replaces newlines first: a YAML block scalar's value parses the same.
        loaded = json.loads(text.replace("\n", " "))
    except ValueError as error:
        raise _bad(f"not valid JSON ({error})") from None
    if not isinstance(loaded, list) or not loaded:
        raise _bad("must be a non-empty list of pools")
    pools = []
    for index, entry in enumerate(loaded):
        where = f"[{index}]"
        if not isinstance(entry, dict):
            raise _bad(f"{where} must be an object")
        segments = entry.get("domainSegments")
        if not isinstance(segments, list) or not segments:
            raise _bad(f"{where}.domainSegments must be a non-empty list (a pool without segments would match "
                       "every node)")
        pairs = []
        for position, segment in enumerate(segments):
            inner = f"{where}.domainSegments[{position}]"
            if not isinstance(segment, dict):
                raise _bad(f"{inner} must be an object")
            pairs.append((_text(segment, "domainLabel", inner), _text(segment, "value", inner)))
        pools.append(TopologyPool(_text(entry, "poolName", where), _text(entry, "dataPool", where, required=False),
                                  tuple(pairs)))
    return tuple(pools)


def match_first(pools: Sequence[TopologyPool], requirements: Requirements) -> Match | None:
    """The first pool matching a requirement topology, preferred ones first; None if none."""
    for topology in (*requirements.preferred, *requirements.requisite):
        for pool in pools:
            if pool.matches(topology):
                return Match(pool, dict(topology))
    return None


def _describe(requirements: Requirements) -> str:
    return ", ".join(str(dict(t)) for t in (*requirements.preferred, *requirements.requisite))


def choose(pools: Sequence[TopologyPool], requirements: Requirements) -> Match:
    """The pool for a new volume: ResourceExhausted when none matches (CSI's code for "cannot be
    provisioned in this topology"; the provisioner then lets the scheduler pick another node)."""
    found = match_first(pools, requirements)
    if found is None:
        raise ResourceExhausted(
            f"none of the pools of {KEY} ({', '.join(p.pool for p in pools)}) has domain segments matching the "
            f"requested topology ({_describe(requirements)}); add a pool for that domain to the StorageClass or "
            "check the nodes' --domainlabels"
        )
    return found


def match_pool(pools: Sequence[TopologyPool], requirements: Requirements, pool: str) -> Match | None:
    """`pool` against the requirements, when it is one of the pools (else None): where a volume
    that already exists, or the snapshot a restore reads, lives."""
    return match_first([p for p in pools if p.pool == pool], requirements)
