"""Which pool a CreateVolume journals and creates in, for a class with `topologyConstrainedPools`
(cephcsi.volumes.topology): the parameters the ordinary create path then runs with.

As ceph-csi ≥ 3.11 does, a new topology-constrained volume is an ordinary volume of its chosen
pool: name key, record and image all there, the volume id naming that pool, so nothing but the
pool choice differs from the create path every other volume takes (and its crash-safety is that
path's). The split layout of older ceph-csi (name key in `pool`, image elsewhere) is still read,
through the name key in `pool` (cephcsi.volumes.split_journal). Design: docs/topology.md.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from contextlib import ExitStack

from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.errors import AlreadyExists, NotFound, ResourceExhausted
from cephcsi.volumes import topology
from cephcsi.volumes.clones import ContentSource
from cephcsi.volumes.parameters import VolumeParameters
from cephcsi.volumes.topology import Requirements
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)

_unconstrained_warned = threading.Event()

HasName = Callable[[Ioctx], bool]
"""Whether the request's name is reserved in the journal of the pool this handle opens."""
ReleaseImageless = Callable[[str], bool]
"""Undo the request's reservation in this pool if no image exists for it (a create that failed
or was killed before its image); True when the name is free there afterwards."""


def _reserved_in(session: Session, pools: list[str], has_name: HasName) -> str | None:
    for pool in pools:
        with ExitStack() as stack:
            try:
                io = stack.enter_context(session.ioctx(pool))
            except NotFound:
                continue  # a pool that does not exist holds no volume
            if has_name(io):
                return pool
    return None


def _warn_unconstrained() -> None:
    # ceph-csi uses the class's pool too (kept for its users' classes), but silently it hides a
    # deployment without the opt-in: said once per process, not per volume.
    if not _unconstrained_warned.is_set():
        _unconstrained_warned.set()
        log.warning("a class with topologyConstrainedPools got a CreateVolume without accessibility requirements; the "
                    "volume goes to the class's `pool` (as ceph-csi). To place volumes by topology, enable it with "
                    "--feature-gates=Topology=true on the controller and --domainlabels on the nodes "
                    "(docs/topology.md); this is logged once per process")


def _in_pool(params: VolumeParameters, match: topology.Match) -> VolumeParameters:
    # The topology pool's dataPool replaces the class's, also when it has none (as ceph-csi).
    return dataclasses.replace(params, pool=match.pool.pool, data_pool=match.pool.data_pool)


def _source_pool(session: Session, source_id: str) -> str | None:
    try:
        pool_id = VolumeId.decode(source_id).pool_id
    except MalformedId:
        return None  # the clone path refuses it with its own message
    return session.pool_name(pool_id)


def place(session: Session, params: VolumeParameters, requirements: Requirements | None,
          source: ContentSource | None, has_name: HasName, release: ReleaseImageless) -> VolumeParameters:
    """The parameters to create with: `params` itself without topology pools or requirements
    (ceph-csi uses the class's pool then), else those of the pool chosen for the requirements.

    A name already reserved in the class's pool or any topology pool stays there while that
    pool matches the requirements: a retry finds the volume its first attempt made or began.
    A reservation in a pool the requirements no longer match (the claim was rescheduled) is
    released when no image exists for it, and the volume placed afresh; with an image it is
    ALREADY_EXISTS. A restore from a snapshot goes to its source's pool, which must be a
    topology pool matching the requirements (ceph-csi's rule: its restore is an RBD clone kept
    in its parent's pool). A volume clone is placed by the requirements like a new volume, as
    ceph-csi places it, and cloned across pools when its source lives in another one (a clone
    v2 may: cephcsi.volumes.clones)."""
    if not params.topology_pools:
        return params
    if requirements is None or requirements.empty:
        _warn_unconstrained()
        return params
    pools = params.topology_pools
    names = [params.pool, *dict.fromkeys(p.pool for p in pools if p.pool != params.pool)]
    reserved = _reserved_in(session, names, has_name)
    # The class's pool that is not itself a topology pool: a volume made there before the
    # class had topology pools (or without requirements) stays as it is.
    if reserved == params.pool and all(p.pool != params.pool for p in pools):
        return params
    if reserved is not None:
        match = topology.match_pool(pools, requirements, reserved)
        if match is not None:
            return _in_pool(params, match)
        if not release(reserved):
            raise AlreadyExists(
                f"the volume of this name already exists in pool {reserved!r}, whose domain segments do not match "
                "the requested topology; delete it or request a topology that includes it"
            )
    # Only a restore is tied to its source's pool; a volume clone falls through to the
    # requirements, so that a claim cloned by either driver lands in the same pool.
    if source is not None and source.kind == "snapshot":
        pool = _source_pool(session, source.source_id)
        if pool is None:
            return params
        match = topology.match_pool(pools, requirements, pool)
        if match is None:
            raise ResourceExhausted(
                f"the source snapshot is in pool {pool!r}, which is not one of the {topology.KEY} whose domain "
                "segments match the requested topology; a restore from a snapshot stays in its source's pool"
            )
        return _in_pool(params, match)
    return _in_pool(params, topology.choose(pools, requirements))


def accessible(params: VolumeParameters, requirements: Requirements | None, pool: str) -> dict[str, str] | None:
    """The accessible topology of a volume in `pool`: the requirement it matched, or None when
    the class has no topology pools, the request no requirements, or `pool` is not among them."""
    if not params.topology_pools or requirements is None:
        return None
    match = topology.match_pool(params.topology_pools, requirements, pool)
    return match.segments if match is not None else None


def for_segment(params: VolumeParameters, segments: dict[str, str] | None) -> VolumeParameters | None:
    """The parameters a volume created in `segments` (GetCapacity's accessible topology) would
    get: `params` without topology pools or segments, None when no topology pool matches them
    (nothing can be provisioned there)."""
    if not params.topology_pools or not segments:
        return params
    match = topology.match_first(params.topology_pools, Requirements(requisite=(segments,)))
    return _in_pool(params, match) if match is not None else None
