"""Growing an RBD image: the one librbd call ControllerExpandVolume makes, checks and resize in one
read-write open (callers hold the volume's journal lease). Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import Internal
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

Needed = Callable[[int], bool]
"""Given the image's size in bytes when opened, whether to grow it; may raise to refuse the call
(nothing has changed by then)."""


@dataclass(frozen=True)
class Grown:
    before: int
    """Size in bytes when the image was opened."""
    after: int
    """Size in bytes now (never smaller than `before`)."""

    @property
    def changed(self) -> bool:
        return self.after != self.before


class ForeignImage(Internal):
    """The image under the name has another id than the caller expected; it was not touched."""

    def __init__(self, name: str, found: str, expected: str) -> None:
        super().__init__(f"image {name!r} has id {found}, not the expected {expected}; not resized")
        self.found = found
        self.expected = expected


def grow(io: rados.Ioctx, name: str, size: int, expected_id: str = "", needed: Needed | None = None) -> Grown | None:
    """Make image `name` at least `size` bytes, in one read-write open; None when there is no
    image of that name.

    Before anything changes: ForeignImage when `expected_id` is set and the image's id differs,
    then `needed(current size)` decides (default: only when smaller than `size`). An image
    already `size` bytes or larger is never resized, whatever `needed` says, and
    allow_shrink=False makes librbd itself refuse to shrink, so even a racing writer can never
    cut data off the end of the image."""
    with ceph_call("resize image", f"image {name!r}"):
        try:
            image = rbd.Image(io, name)
        except rbd.ImageNotFound:
            return None
        with image:
            _check_id(image, name, expected_id)
            before = image.size()
            if not (needed or _smaller_than(size))(before) or before >= size:
                return Grown(before, before)
            image.resize(size, allow_shrink=False)
    # A resize that returned made the image exactly `size` bytes. Not read back: the resize's
    # own header-update notice marks this handle stale, and size() would then refresh the
    # header first (5 more reads for a number we already know).
    log.info("image grown", extra=fields(image=name, before=before, after=size))
    return Grown(before, size)


def _check_id(image: rbd.Image, name: str, expected_id: str) -> None:
    found = str(image.id())
    if expected_id and found != expected_id:
        raise ForeignImage(name, found, expected_id)


def _smaller_than(size: int) -> Needed:
    return lambda current: current < size
