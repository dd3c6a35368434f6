"""The image of a volume CreateVolume makes: written by the driver itself under an id journaled
first (cephcsi.ceph.image_create) where the layout allows, else by librbd's `RBD.create`; and
adopted when an earlier attempt already made it."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import rados

from cephcsi.ceph import image_create, images, imagestate, trash
from cephcsi.ceph.connection import Session
from cephcsi.errors import AlreadyExists
from cephcsi.observability.logging import fields
from cephcsi.volumes import failpoints
from cephcsi.volumes.capacity import fits
from cephcsi.volumes.journal import PLANNED_IMAGE_ID, Journal, Record

if TYPE_CHECKING:
    from cephcsi.volumes.manager import CreateRequest

log = logging.getLogger(__name__)

ID_TRIES = 3
"""Ids planned for one image before giving up: each is taken with a chance of about one in 2^56
per image in the pool."""


def hand_order(session: Session, io: rados.Ioctx, request: CreateRequest) -> int | None:
    """The order of a new image this call may write itself (cephcsi.ceph.image_create), or
    None when librbd must make it (a source, a data pool, a layout or feature it does not
    write, a pool not validated for RBD yet)."""
    params = request.parameters
    if request.source is not None:
        return None
    order = session.plain_order(io, params.data_pool)
    if order is None or not image_create.can_write(images.feature_mask(params.features), request.size, order):
        return None
    return order


def ensure(session: Session, io: rados.Ioctx, request: CreateRequest, journal: Journal, record: Record,
           fresh: bool, order: int | None) -> tuple[str, int, bool]:
    """(image id, size, made by this call) of the volume's image, creating it when it does
    not exist yet; the id is '' for an image librbd made for this call (not read: see
    create).

    `fresh`: the name was reserved by this very call, so nothing can have made its image
    yet and the existence probe is skipped (create still handles a taken name)."""
    planned = record.unjournaled_planned_id
    if planned:
        # A killed attempt may have written part of the image under the planned id: a complete
        # image is adopted below like any other, anything less is removed here first.
        complete = not fresh and image_create.settle(io, record.image_name, planned)
        if not complete:
            if order is None:
                order = hand_order(session, io, request)
            if order is not None:
                return _write(io, request, journal, record, planned, order), request.size, True
            journal.forget(record.uuid, PLANNED_IMAGE_ID)  # librbd makes it, with an id of its own
    return _ensure_by_librbd(session, io, request, record.image_name, maybe_exists=not fresh)


def _write(io: rados.Ioctx, request: CreateRequest, journal: Journal, record: Record, image_id: str,
           order: int) -> str:
    """Write the new image under the journaled id; a taken id is replaced (journaled first)."""
    features = images.feature_mask(request.parameters.features)
    tries = 0
    while True:
        tries += 1
        log.info("creating image", extra=fields(image=record.image_name, pool=request.parameters.pool,
                                                bytes=request.size, image_id=image_id))
        try:
            image_create.write(io, image_create.NewImage(record.image_name, image_id, request.size, features, order))
        except image_create.IdTaken:
            if tries == ID_TRIES:
                raise
            image_id = image_create.new_image_id()
            journal.update(record.uuid, {PLANNED_IMAGE_ID: image_id})
            continue
        failpoints.reach("create.after-image")
        return image_id


def _ensure_by_librbd(session: Session, io: rados.Ioctx, request: CreateRequest, name: str,
                      maybe_exists: bool = True) -> tuple[str, int, bool]:
    params = request.parameters
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
    if info is None:
        log.info("creating image", extra=fields(image=name, pool=params.pool, bytes=request.size))
        with session.creating_in(io, params.data_pool):
            image_id = images.create(io, name, request.size, params.features, params.data_pool, with_id=False)
        failpoints.reach("create.after-image")
        return image_id, request.size, True
    if not fits(info.size, request.required_bytes, request.limit_bytes):
        raise AlreadyExists(
            f"volume {request.name!r} already exists with {info.size} bytes, which does not fit the "
            f"requested range [{request.required_bytes}, {request.limit_bytes or 'unbounded'}]"
        )
    return info.image_id, info.size, False
