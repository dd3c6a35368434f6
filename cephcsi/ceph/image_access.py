"""What cephcsi.volumes asks of an image without knowing librbd: open it if it exists, remove a
parent while a child purge may still watch it, and move it to the trash by whichever path is
verified for this cluster. Callers keep their `ceph_call` around these. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeAlias, TypeVar

import rados
import rbd

from cephcsi.ceph import layering, trash, trash_move
from cephcsi.ceph.connection import Session
from cephcsi.ceph.imagestate import ImageState

T = TypeVar("T")

Image: TypeAlias = rbd.Image
"""An open librbd image as cephcsi.volumes holds one across several steps; the steps themselves
are this module's and cephcsi.ceph.layering's functions."""


def open_image(io: rados.Ioctx, name: str, *, read_only: bool = False) -> Image:
    """Image `name` opened (a read-write open registers a watch); the caller closes it (`with`)
    inside its `ceph_call`, which translates a missing image."""
    return rbd.Image(io, name, read_only=read_only)


def if_exists(io: rados.Ioctx, use: Callable[[rbd.Image], T], name: str, *, read_only: bool = False) -> T | None:
    """`use(image)` on image `name` opened for it, or None when it does not exist: missing at
    the open, or removed while `use` ran."""
    return _unless_gone(lambda: rbd.Image(io, name, read_only=read_only), use)


def if_exists_by_id(io: rados.Ioctx, use: Callable[[rbd.Image], T], image_id: str) -> T | None:
    """`if_exists` for a read-only open by id (`layering.open_by_id`: also an image in the trash)."""
    return _unless_gone(lambda: layering.open_by_id(io, image_id), use)


def _unless_gone(open_image: Callable[[], rbd.Image], use: Callable[[rbd.Image], T]) -> T | None:
    try:
        with open_image() as image:
            return use(image)
    except rbd.ImageNotFound:
        return None


def if_readable(io: rados.Ioctx, use: Callable[[rbd.Image], T], name: str) -> T | None:
    """`use(image)` on a read-only open of image `name`, or None on any librbd or librados
    failure: for a speculative read whose caller repeats it with errors reported (`if_exists`
    in a ceph_call) when this one says nothing."""
    try:
        with rbd.Image(io, name, read_only=True) as image:
            return use(image)
    except (rbd.Error, rados.Error):
        return None


def remove_waiting_for_watchers(io: rados.Ioctx, name: str, wait: float) -> None:
    """`RBD.remove` of image `name`, retried for up to `wait` seconds while it is busy (a child
    purge's brief watch on a clone parent); librbd's error after that."""
    deadline = time.monotonic() + wait
    while True:
        try:
            rbd.RBD().remove(io, name)
            return
        except rbd.ImageBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


class TrashMover:
    """Moves an image to the trash: by hand (cephcsi.ceph.trash_move) when hand writes are
    verified for this session's cluster and client, the image is live, proven unused and named
    consistently, and its features, mirroring and the trash's watchers allow it; by librbd
    (cephcsi.ceph.trash) otherwise, which also resumes every interrupted move.

    Built as soon as the image id is known so that the eligibility reads travel with the
    caller's other reads; nothing is lost if `move` is never called."""

    def __init__(self, session: Session, io: rados.Ioctx, image_id: str | None) -> None:
        self._io = io
        self._eligibility = trash_move.Eligibility(io, image_id) if image_id and session.hand_writes() else None

    def move(self, state: ImageState, proven_unused: bool) -> None:
        """`proven_unused`: no watcher and no snapshot, read from the header of `state.image_id`
        (the hand move sends no request to watchers, so an open image must go through librbd)."""
        eligibility = self._eligibility
        if (state.live and proven_unused and state.named_consistently and eligibility is not None
                and state.image_id == eligibility.image_id and eligibility.result()):
            trash_move.move(self._io, state.name, state.image_id)
        else:
            trash.move(self._io, state)
