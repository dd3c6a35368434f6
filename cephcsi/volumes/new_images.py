"""The image of a volume CreateVolume makes, as journal steps: the id the Ceph layer plans to
write under is journaled first (cephcsi.ceph.image_ensure chooses between writing the image by
hand and librbd's create), what a killed attempt left under it is settled, and an image an
earlier attempt already made is adopted when its size fits the request."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cephcsi.ceph import image_ensure
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.errors import AlreadyExists
from cephcsi.volumes import failpoints
from cephcsi.volumes.capacity import fits
from cephcsi.volumes.journal import PLANNED_IMAGE_ID, Journal, Record

if TYPE_CHECKING:
    from cephcsi.volumes.manager import CreateRequest


def _wanted(request: CreateRequest, name: str) -> image_ensure.Wanted:
    params = request.parameters
    return image_ensure.Wanted(params.pool, name, request.size, params.features, params.data_pool)


def hand_order(session: Session, io: Ioctx, request: CreateRequest) -> int | None:
    """The order of a new image the Ceph layer writes by hand under an id journaled first, or
    None when librbd must make it (a content source always goes through librbd's clone)."""
    if request.source is not None:
        return None
    return image_ensure.hand_order(session, io, _wanted(request, ""))


def ensure(session: Session, io: Ioctx, request: CreateRequest, journal: Journal, record: Record,
           fresh: bool, order: int | None) -> tuple[str, int, bool]:
    """(image id, size, made by this call) of the volume's image, creating it when it does
    not exist yet; the id is '' for an image librbd made for this call (not read: see
    create).

    `fresh`: the name was reserved by this very call, so nothing can have made its image
    yet and the existence probe is skipped (create still handles a taken name)."""
    wanted = _wanted(request, record.image_name)
    planned = record.unjournaled_planned_id
    if planned:
        # A killed attempt may have written part of the image under the planned id: a complete
        # image is adopted below like any other, anything less is removed here first.
        complete = not fresh and image_ensure.settle_planned(io, record.image_name, planned)
        if not complete:
            if order is None:
                order = hand_order(session, io, request)
            if order is not None:
                image_id = image_ensure.write_planned(
                    io, wanted, planned, order, lambda new_id: journal.update(record.uuid, {PLANNED_IMAGE_ID: new_id}))
                failpoints.reach("create.after-image")
                return image_id, request.size, True
            journal.forget(record.uuid, PLANNED_IMAGE_ID)  # librbd makes it, with an id of its own
    ensured = image_ensure.find_or_create(session, io, wanted, maybe_exists=not fresh)
    if ensured.made:
        failpoints.reach("create.after-image")
    elif not fits(ensured.size, request.required_bytes, request.limit_bytes):
        raise AlreadyExists(
            f"volume {request.name!r} already exists with {ensured.size} bytes, which does not fit the "
            f"requested range [{request.required_bytes}, {request.limit_bytes or 'unbounded'}]"
        )
    return ensured.image_id, ensured.size, ensured.made
