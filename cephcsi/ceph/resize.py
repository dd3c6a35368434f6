"""Growing an RBD image: the one librbd call ControllerExpandVolume makes.

Separate from cephcsi.ceph.images (read-only inspection, create) because it is the only call
that opens an image read-write outside the node plugin: the open registers a watch for the few
milliseconds the resize takes, which a concurrent DeleteVolume would see as a watcher (it then
answers FAILED_PRECONDITION and is retried). Callers hold the volume's journal lease, so that
cannot happen with this driver's own delete.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph.errors import ceph_call
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Grown:
    before: int
    """Size in bytes when the image was opened."""
    after: int
    """Size in bytes now (never smaller than `before`)."""

    @property
    def changed(self) -> bool:
        return self.after != self.before


def grow(io: rados.Ioctx, name: str, size: int) -> Grown:
    """Make image `name` at least `size` bytes; an image already that large is left as it is.

    allow_shrink=False makes librbd itself refuse to shrink, so even a racing caller with a
    stale size can never cut data off the end of the image."""
    with ceph_call("resize image", f"image {name!r}"):
        with rbd.Image(io, name) as image:
            before = image.size()
            if before >= size:
                return Grown(before, before)
            image.resize(size, allow_shrink=False)
            after = image.size()
    log.info("image grown", extra=fields(image=name, before=before, after=after))
    return Grown(before, after)
