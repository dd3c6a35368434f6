"""A new image's objects written in one round trip, under an id the caller journaled first, exactly
as librbd writes a plain format-2 image (`can_write`). `IdTaken` when the id belongs to another
image: the first attempt undoes its writes and the caller plans a new id. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
import logging
import secrets
import struct
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph import encoding, images, imagestate, omap
from cephcsi.ceph.batch import Batch, Pending
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import Internal
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DIRECTORY = images.DIRECTORY
TRASH = imagestate.TRASH
ID_HEX_DIGITS = 14
"""The length of librbd's image ids (it cuts longer ones to this)."""
FEATURES_BY_HAND = (rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_EXCLUSIVE_LOCK | rbd.RBD_FEATURE_OBJECT_MAP
                    | rbd.RBD_FEATURE_FAST_DIFF | rbd.RBD_FEATURE_DEEP_FLATTEN)
OBJECT_MAP_LIMIT = 256_000_000
"""cls_rbd's largest object map (objects); librbd refuses a larger image with object-map."""
OBJECT_NONEXISTENT = 0
"""The object map's state of an object never written."""
_EXISTS: dict[int, bool | None] = {-errno.EEXIST: False}


class IdTaken(Internal):
    """The planned id belongs to another image in the pool; what this attempt wrote is undone."""


def new_image_id() -> str:
    return secrets.token_hex(ID_HEX_DIGITS // 2)


@dataclass(frozen=True)
class NewImage:
    name: str
    image_id: str
    size: int
    features: int
    """As requested (librbd's feature bits)."""
    order: int

    @property
    def header_features(self) -> int:
        if self.features & rbd.RBD_FEATURE_OBJECT_MAP:
            return self.features | rbd.RBD_FEATURE_FAST_DIFF
        return self.features

    def header_request(self) -> bytes:
        """cls_rbd `create`: size, order, features, object prefix, data pool id (-1: none)."""
        return (struct.pack("<QBQ", self.size, self.order, self.header_features)
                + encoding.string(f"rbd_data.{self.image_id}") + struct.pack("<q", -1))


def can_write(features: int, size: int, order: int) -> bool:
    """Whether `write` makes this image as librbd would (else use `RBD.create`)."""
    if features & ~FEATURES_BY_HAND:
        return False
    return not features & rbd.RBD_FEATURE_OBJECT_MAP or _object_count(size, order) <= OBJECT_MAP_LIMIT


def write(io: rados.Ioctx, image: NewImage) -> None:
    """Write a new image's objects (first attempt: none of them can exist yet under this id).

    On IdTaken nothing of this attempt is left. On any other error what landed stays, for
    `settle` to find: the id is journaled."""
    batch = Batch(io)
    directory = _add_to_directory(batch, image.name, image.image_id)
    id_object = _create_id_object(batch, image.name, image.image_id)
    header = batch.write(f"rbd_header.{image.image_id}", "create image header",
                         lambda op: _exclusive_call(op, "create", image.header_request()), _EXISTS)
    batch.wait()
    landed = {what: pending.result() for what, pending in
              (("directory", directory), ("id object", id_object), ("header", header))}
    if all(landed.values()):
        _make_object_map(io, image.image_id, image.header_features, image.size, image.order)
        return
    log.warning("image id taken by another image: undoing this attempt",
                extra=fields(image=image.name, image_id=image.image_id,
                             taken=sorted(what for what, done in landed.items() if not done)))
    _undo(io, image.name, image.image_id, id_object=bool(landed["id object"]), header=bool(landed["header"]),
          directory=bool(landed["directory"]))
    raise IdTaken(f"image id {image.image_id!r} of image {image.name!r} is taken in its pool; retry")


@dataclass(frozen=True)
class Traces:
    """What exists of the image `name` with the planned id `image_id`."""

    name: str
    image_id: str
    named_id: str | None
    """The id the directory lists under `name`."""
    id_named: str | None
    """The name the directory lists under `image_id`."""
    id_object: str | None
    header: dict[str, bytes] | None
    in_trash: bool

    @property
    def header_is_ours(self) -> bool:
        return self.header is not None and not self.in_trash and self.id_named in (None, self.name)

    @property
    def complete(self) -> bool:
        return (self.header_is_ours and self.named_id == self.image_id and self.id_object == self.image_id)


def read_traces(io: rados.Ioctx, name: str, image_id: str) -> Traces:
    batch = Batch(io)
    directory = batch.omap(DIRECTORY, (f"name_{name}", f"id_{image_id}"))
    id_object = batch.read(f"rbd_id.{name}", 4096)
    header = batch.omap(f"rbd_header.{image_id}", ("size", "order", "features"))
    trash = batch.omap(TRASH, (f"id_{image_id}",))
    batch.wait()
    listed = directory.result() or {}
    raw_id = id_object.result()
    return Traces(
        name=name,
        image_id=image_id,
        named_id=_string_or_none(listed.get(f"name_{name}")),
        id_named=_string_or_none(listed.get(f"id_{image_id}")),
        id_object=_string_or_none(raw_id) if raw_id else None,
        header=header.result(),
        in_trash=bool(trash.result()),
    )


def settle(io: rados.Ioctx, name: str, image_id: str) -> bool:
    """After an attempt that may have been killed between its writes: True when the image is
    complete under the planned id (its object map ensured); else whatever the attempt left is
    removed — it never held data, as nothing could open it by name yet — and False."""
    traces = read_traces(io, name, image_id)
    if traces.complete:
        assert traces.header is not None
        values = traces.header
        if {"size", "order", "features"} <= values.keys():
            (size,) = struct.unpack_from("<Q", values["size"])
            (features,) = struct.unpack_from("<Q", values["features"])
            _make_object_map(io, image_id, features, size, values["order"][0])
        return True
    if traces.header is not None and not traces.header_is_ours:
        log.warning("planned image id belongs to another image: leaving it alone",
                    extra=fields(image=name, image_id=image_id))
    if traces.id_object or traces.named_id or traces.header_is_ours:
        log.info("removing what a killed create of the image left", extra=fields(image=name, image_id=image_id))
    _undo(io, name, image_id, id_object=traces.id_object == image_id, header=traces.header_is_ours,
          directory=traces.named_id == image_id)
    return False


def _undo(io: rados.Ioctx, name: str, image_id: str, id_object: bool, header: bool, directory: bool) -> None:
    """Remove the objects of this image that are ours, the directory entry last: it is what
    proves a header ours (`Traces.header_is_ours`) to a retry after a crash in between."""
    if id_object:
        omap.remove_object(io, f"rbd_id.{name}")
    if header:
        omap.remove_object(io, f"rbd_object_map.{image_id}")
        omap.remove_object(io, f"rbd_header.{image_id}")
    if directory:
        with ceph_call("remove an unfinished image from the directory", f"image {name!r}"):
            images.remove_from_directory(io, name, image_id)


def _add_to_directory(batch: Batch, name: str, image_id: str) -> Pending[bool | None]:
    request = encoding.string(name) + encoding.string(image_id)
    # cls_rbd answers EEXIST for a listed name, EBADF for a listed id.
    return batch.write(DIRECTORY, "add image to directory",
                       lambda op: op.execute("rbd", "dir_add_image", request), {**_EXISTS, -errno.EBADF: False})


def _create_id_object(batch: Batch, name: str, image_id: str) -> Pending[bool | None]:
    return batch.write(f"rbd_id.{name}", "create image id object",
                       lambda op: _exclusive_call(op, "set_id", encoding.string(image_id)), _EXISTS)


def _exclusive_call(op: rados.WriteOp, method: str, request: bytes) -> None:
    op.new(rados.LIBRADOS_CREATE_EXCLUSIVE)
    op.execute("rbd", method, request)


def _make_object_map(io: rados.Ioctx, image_id: str, features: int, size: int, order: int) -> None:
    """The HEAD object map, every object nonexistent; a no-op on one of the same size."""
    if not features & rbd.RBD_FEATURE_OBJECT_MAP:
        return
    request = struct.pack("<QB", _object_count(size, order), OBJECT_NONEXISTENT)
    with ceph_call("create object map", f"image id {image_id!r}"):
        io.execute(f"rbd_object_map.{image_id}", "rbd", "object_map_resize", request)


def _object_count(size: int, order: int) -> int:
    return -(-size // (1 << order))


def _string_or_none(raw: bytes | None) -> str | None:
    return images.decode_id_object(raw) if raw else None
