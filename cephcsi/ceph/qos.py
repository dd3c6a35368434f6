"""librbd's side of RBD QoS: the image-meta keys (`conf_rbd_qos_…_limit`) a volume's limits live in,
read from the header and written through librbd; a write changes only the keys given. Design:
docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import rados
import rbd

from cephcsi.ceph import image_metadata, images
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import Internal, InvalidArgument
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


def read(io: rados.Ioctx, name: str, image_id: str) -> dict[str, str] | None:
    """Every metadata key of the image (QoS and others); None when it is gone. Without
    `image_id` the id is looked up by name."""
    header_id = image_id or images.lookup_id(io, name)
    if not header_id:
        return None
    return image_metadata.read_header(io, name, header_id)


def write(io: rados.Ioctx, name: str, expected_id: str, changes: Mapping[str, str | None],
          between: Callable[[str], None] = lambda key: None) -> bool:
    """Set each key of `changes` to its value, or remove it where the value is None, in one
    read-write open of image `name`. False when the image is gone. `between(key)` runs after
    each key is written (the crash tests stop there)."""
    if not changes:
        return True
    with ceph_call("set image QoS", f"image {name!r}"):
        try:
            image = rbd.Image(io, name)
        except rbd.ImageNotFound:
            return False
        with image:
            found = str(image.id())
            if expected_id and found != expected_id:
                raise Internal(f"image {name!r} has id {found}, not the expected {expected_id}; QoS not changed")
            for key, value in changes.items():
                if value is None:
                    try:
                        image.metadata_remove(key)
                    except (KeyError, rbd.ObjectNotFound):
                        pass  # removed by an earlier, interrupted attempt
                else:
                    try:
                        image.metadata_set(key, value)
                    except rbd.InvalidArgument:
                        # librbd refused a configuration value our checks let through.
                        raise InvalidArgument(f"librbd refused {key}={value!r} on image {name!r}") from None
                between(key)
    log.info("image QoS set", extra=fields(image=name, keys=sorted(changes)))
    return True
