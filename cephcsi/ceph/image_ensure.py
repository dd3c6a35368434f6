"""A new volume's image, made by whichever path fits (by hand under a journaled id, or librbd's
`RBD.create`), and adopted when an earlier attempt already made it. The caller journals what it is
told: the planned id (`hand_order`), a new one when it is taken (`replan`). Design:
docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cephcsi.ceph import image_create, images, imagestate, trash
from cephcsi.observability.logging import fields

if TYPE_CHECKING:
    from rados import Ioctx

    from cephcsi.ceph.connection import Session

log = logging.getLogger(__name__)

ID_TRIES = 3
"""Ids planned for one image before giving up: each is taken with a chance of about one in 2^56
per image in the pool."""


@dataclass(frozen=True)
class Wanted:
    """The image a volume asks for."""

    pool: str
    """For the log only: the ioctx is the pool."""
    name: str
    size: int
    features: tuple[str, ...]
    data_pool: str | None


@dataclass(frozen=True)
class Ensured:
    image_id: str
    """'' for an image librbd made in this call (reading its id is one more round trip)."""
    size: int
    made: bool
    """Made by this call; else an image that was there already (its size is what it has)."""


def hand_order(session: Session, io: Ioctx, wanted: Wanted) -> int | None:
    """The order of a new image `write_planned` may write, or None when librbd must make it (a
    data pool, a layout or feature the hand path does not write, a pool not validated for RBD
    yet, hand writes not verified for this cluster and client)."""
    order = session.plain_order(io, wanted.data_pool)
    if order is None or not image_create.can_write(images.feature_mask(wanted.features), wanted.size, order):
        return None
    return order


def plan_id() -> str:
    """A new image id for the caller to journal before `write_planned` writes under it."""
    return image_create.new_image_id()


def settle_planned(io: Ioctx, name: str, planned_id: str) -> bool:
    """True when a complete image exists under the planned id; else whatever a killed attempt
    wrote under it is removed first (cephcsi.ceph.image_create.settle)."""
    return image_create.settle(io, name, planned_id)


def write_planned(io: Ioctx, wanted: Wanted, image_id: str, order: int, replan: Callable[[str], None]) -> str:
    """Write the new image under the journaled id `image_id` and return the id it has. A taken
    id is replaced: `replan` journals the new one before it is written."""
    features = images.feature_mask(wanted.features)
    tries = 0
    while True:
        tries += 1
        log.info("creating image", extra=fields(image=wanted.name, pool=wanted.pool, bytes=wanted.size,
                                                image_id=image_id))
        try:
            image_create.write(io, image_create.NewImage(wanted.name, image_id, wanted.size, features, order))
        except image_create.IdTaken:
            if tries == ID_TRIES:
                raise
            image_id = image_create.new_image_id()
            replan(image_id)
            continue
        return image_id


def find_or_create(session: Session, io: Ioctx, wanted: Wanted, maybe_exists: bool = True) -> Ensured:
    """The image named `wanted.name` as it is, or made now by librbd. `maybe_exists=False`:
    nothing can have made it yet, so the existence probe is skipped (create still handles a
    taken name)."""
    name = wanted.name
    found_id = images.lookup_id(io, name) if maybe_exists else None
    if found_id is not None:
        state = imagestate.inspect(io, name, found_id)
        if state.unlisted:
            # A librbd that lists a new image last was killed just before: finished, then adopted.
            images.list_unlisted(io, name, found_id)
    info = images.stat(io, name) if found_id is not None else None
    if info is None and maybe_exists:
        # An earlier attempt may have removed its partial image by name and been killed
        # inside librbd's remove: that leaves a trash entry under the name we are about to
        # use again, which nothing would look for afterwards.
        trash.finish_removal(io, name)
    if info is not None:
        return Ensured(info.image_id, info.size, made=False)
    log.info("creating image", extra=fields(image=name, pool=wanted.pool, bytes=wanted.size))
    with session.creating_in(io, wanted.data_pool):
        image_id = images.create(io, name, wanted.size, wanted.features, wanted.data_pool, with_id=False)
    return Ensured(image_id, wanted.size, made=True)
