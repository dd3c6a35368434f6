"""Read, set and remove RBD image metadata keys on the image header directly, one RADOS operation
each, atomically for several keys (for the publish records; keys outside librbd's `conf_`
namespace only). Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import rados

from cephcsi.ceph import image_metadata, images, omap
from cephcsi.errors import NotFound

_PREFIX = image_metadata.METADATA_PREFIX


def image_id(io: rados.Ioctx, name: str) -> str:
    found = images.lookup_id(io, name)
    if not found:
        raise NotFound(f"image {name!r} does not exist")
    return found


def read(io: rados.Ioctx, name: str, header_id: str) -> dict[str, str]:
    """Every metadata key of the image; NotFound when its header is gone."""
    found = image_metadata.read_header(io, name, header_id)
    if found is None:
        raise NotFound(f"image {name!r} does not exist")
    return found


def set_keys(io: rados.Ioctx, name: str, header_id: str, values: Mapping[str, str]) -> None:
    """Set every key in one class call; NotFound when the header is gone."""
    image_metadata.set_on_header(io, name, header_id, values)


def remove_keys(io: rados.Ioctx, name: str, header_id: str, keys: Iterable[str]) -> None:
    """Remove the keys in one operation (absent keys are no error); NotFound when the header is gone."""
    wanted = tuple(_PREFIX + key for key in keys)
    if wanted:
        omap.remove_keys(io, f"rbd_header.{header_id}", wanted)
