"""RBD image metadata (`rbd image-meta`): read all of it, or make some keys hold given values;
`set_on_new` writes to an image just created without opening it. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import rados
import rbd

from cephcsi.ceph import encoding, images, omap
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import Internal
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

METADATA_PREFIX = "metadata_"
"""cls_rbd keeps image metadata in the header's omap under this prefix."""
CONFIG_PREFIX = "conf_"
"""Metadata keys librbd reads as configuration overrides (and validates when set through it)."""


def read(io: rados.Ioctx, name: str, image_id: str = "") -> dict[str, str]:
    """Every metadata key of the image; an image that does not exist has none. With `image_id`
    the header is found by id, which also reaches an image in the trash (`cephcsi audit` names
    the claim a trashed image had).

    Read from the header's omap (`metadata_<key>` → the value's bytes), not through librbd's
    `Image.metadata_list()`: the Python bindings' iterator drops empty values but keeps their
    keys, so every key after an empty value is paired with the next key's value (seen with the
    Pacific and Tentacle bindings), and ControllerPublish stores empty values. It is also two
    small reads instead of an image open."""
    header_id = image_id or images.lookup_id(io, name)
    if not header_id:
        return {}
    found = read_header(io, name, header_id)
    return {} if found is None else found


def read_header(io: rados.Ioctx, name: str, header_id: str) -> dict[str, str] | None:
    """Every metadata key on the header `rbd_header.<header_id>`; None when it does not exist."""
    with ceph_call("read image metadata", f"image {name!r}"):
        try:
            with rados.ReadOpCtx() as op:
                # Only the metadata keys: other header keys may hold binary values.
                items, _ = io.get_omap_vals(op, "", METADATA_PREFIX, -1)
                io.operate_read_op(op, f"rbd_header.{header_id}")
                raw = [(key, bytes(value or b"")) for key, value in items]
        except rados.ObjectNotFound:
            return None
    return {key[len(METADATA_PREFIX):]: value.decode() for key, value in raw}


def ensure(io: rados.Ioctx, name: str, wanted: Mapping[str, str], known_empty: bool = False) -> None:
    """Make each key of `wanted` hold its value; other keys are left alone. Idempotent: keys
    that already hold the value are not written (a retried CreateVolume writes nothing).
    `known_empty`: the caller just created the image, so the read (an image open) is skipped."""
    if not wanted:
        return
    current = {} if known_empty else read(io, name)
    missing = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not missing:
        return
    with ceph_call("set image metadata", f"image {name!r}"):
        with rbd.Image(io, name) as image:
            for key, value in missing.items():
                image.metadata_set(key, value)
    log.info("image metadata set", extra=fields(image=name, keys=sorted(missing)))


def check_settable(wanted: Mapping[str, str]) -> None:
    """Refuse keys `set_on_header` must not write (before anything is created or answered)."""
    if any(key.startswith(CONFIG_PREFIX) for key in wanted):
        raise Internal(f"metadata keys starting with {CONFIG_PREFIX!r} are librbd configuration; not set by hand")


def set_on_header(io: rados.Ioctx, name: str, image_id: str, wanted: Mapping[str, str]) -> None:
    """Write `wanted` into the metadata of image `name` (id `image_id`) with one class call on
    its header, for an image nobody can have open yet (docs/design/ceph-access.md)."""
    check_settable(wanted)
    # Only on a header that exists: a write after a purge (the lease lapsed during an outage,
    # another process deleted the image) must not leave a stray header object.
    omap.execute_on_existing(io, f"rbd_header.{image_id}", "rbd", "metadata_set", encoding.string_map(dict(wanted)),
                             "set image metadata", f"image {name!r}")
    # Every provisioned claim passes here (deploy/ sets --extra-create-metadata): the call's own
    # INFO lines already name the image, so this one is DEBUG.
    log.debug("image metadata set", extra=fields(image=name, keys=sorted(wanted)))


def set_on_new(io: rados.Ioctx, name: str, wanted: Mapping[str, str]) -> str:
    """Write `wanted` into the metadata of image `name`, which this caller has just created, and
    return the image's id (read to address its header): one object read and one class call."""
    check_settable(wanted)
    image_id = images.lookup_id(io, name)
    if not image_id:
        raise Internal(f"image {name!r} has no id right after it was created; retry")
    set_on_header(io, name, image_id, wanted)
    return image_id
