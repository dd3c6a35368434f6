"""The flatten policy: how deep clone chains and how many snapshots per image are allowed, and when to
queue mgr flatten tasks. No request waits for a flatten or fails because one is pending. Design:
docs/design/controller.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from cephcsi.ceph import image_access, layering
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.errors import ConfigError
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

KRBD_MAX_CHAIN = 16
"""The kernel client refuses to map an image whose parent chain is longer than this."""


@dataclass(frozen=True)
class FlattenPolicy:
    soft_depth: int = 4
    hard_depth: int = 8
    min_snapshots: int = 250
    max_snapshots: int = 450

    def __post_init__(self) -> None:
        if not 1 <= self.soft_depth <= self.hard_depth < KRBD_MAX_CHAIN:
            raise ConfigError(
                f"clone depth limits must satisfy 1 <= --rbdsoftmaxclonedepth ({self.soft_depth}) <= "
                f"--rbdhardmaxclonedepth ({self.hard_depth}) < {KRBD_MAX_CHAIN} (the kernel client's chain limit)"
            )
        if not 1 <= self.min_snapshots <= self.max_snapshots:
            raise ConfigError(
                f"snapshot limits must satisfy 1 <= --minsnapshotsonimage ({self.min_snapshots}) <= "
                f"--maxsnapshotsonimage ({self.max_snapshots})"
            )


@dataclass(frozen=True)
class Placement:
    """Where an image lives, for mgr task specs."""

    pool: str
    namespace: str
    name: str


def after_create(session: Session, io: Ioctx, image_id: str, where: Placement, policy: FlattenPolicy) -> int:
    """Queue a background flatten if the new image is deeper than the soft limit; its depth
    (read from the headers of its chain: no image is opened)."""
    chain = layering.depth(session, io, image_id)
    if chain > policy.soft_depth:
        log.info("clone chain over the soft limit; flattening in the background",
                 extra=fields(image=where.name, depth=chain, soft_limit=policy.soft_depth))
        layering.queue_flatten(session, where.pool, where.namespace, where.name)
    return chain


def limit_snapshots(session: Session, source: image_access.Image, where: Placement, policy: FlattenPolicy) -> None:
    """Flatten the children of the source's oldest snapshots when it holds too many."""
    snaps = sorted(layering.list_snaps(source), key=lambda s: s.snap_id)
    if len(snaps) < policy.min_snapshots:
        return
    if len(snaps) >= policy.max_snapshots:
        log.warning("image is over its snapshot budget; flattens of its clones are queued",
                    extra=fields(image=where.name, snapshots=len(snaps), max=policy.max_snapshots))
    excess = len(snaps) - policy.min_snapshots + 1
    # Only trash-namespace snapshots: user-namespace ones are a cut in progress or not ours.
    for snap in [s for s in snaps if s.namespace == layering.TRASH_NAMESPACE][:excess]:
        _release(session, layering.children_at(source, snap.snap_id), KRBD_MAX_CHAIN)


def _release(session: Session, children: list[dict[str, object]], hops: int) -> None:
    """Queue the flattens that detach these children from the snapshot they hang from."""
    for child in children:
        pool, namespace = str(child["pool"]), str(child.get("pool_namespace") or "")
        if not child.get("trash"):
            layering.queue_flatten(session, pool, namespace, str(child["image"]))
        elif hops > 0:
            # A deleted image (e.g. a deleted snapshot's) waits in the RBD trash while its own
            # clones read through it, and the mgr flattens only by name, which it no longer has.
            # Flattening those clones lets librbd purge it, which frees the snapshot.
            _release(session, _children_of_trashed(session, pool, namespace, str(child["id"])), hops - 1)


def _children_of_trashed(session: Session, pool: str, namespace: str, image_id: str) -> list[dict[str, object]]:
    with session.ioctx(pool, namespace) as io:
        children = image_access.if_exists_by_id(io, layering.children_of, image_id)
    # None: purged meanwhile, so the snapshot is free already, or will be at once.
    return [] if children is None else children
