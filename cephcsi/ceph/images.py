"""Thin wrappers around librbd for the image operations the driver needs.

Each function opens what it needs, closes it, and translates errors through ceph_call. Images
are opened read-only for inspection: a read-only open registers no watch, so it never shows up
as a "watcher" that would block a concurrent DeleteVolume. Opens are the expensive part
(~5 ms of librbd work), so hot paths check existence with one object read instead.
"""
from __future__ import annotations

import errno
import logging
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph import encoding, omap
from cephcsi.ceph.errors import ceph_call, error_number
from cephcsi.errors import Internal
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DIRECTORY = "rbd_directory"
"""The pool's image directory object (omap `name_<name>` → id, `id_<id>` → name)."""

FEATURE_BITS: dict[str, int] = {
    "layering": rbd.RBD_FEATURE_LAYERING,
    "exclusive-lock": rbd.RBD_FEATURE_EXCLUSIVE_LOCK,
    "object-map": rbd.RBD_FEATURE_OBJECT_MAP,
    "fast-diff": rbd.RBD_FEATURE_FAST_DIFF,
    "deep-flatten": rbd.RBD_FEATURE_DEEP_FLATTEN,
    "journaling": rbd.RBD_FEATURE_JOURNALING,
}


@dataclass(frozen=True)
class ImageInfo:
    name: str
    image_id: str
    size: int
    features: int
    watchers: tuple[str, ...] = ()
    """Addresses of clients with the image open read-write (mapped somewhere); only filled
    when asked for."""


def feature_mask(features: tuple[str, ...]) -> int:
    mask = 0
    for name in features:
        mask |= FEATURE_BITS[name]
    return mask


def lookup_id(io: rados.Ioctx, name: str) -> str | None:
    """The image's id from its `rbd_id.<name>` object, or None if there is none.

    One small object read (~0.2 ms) instead of an image open (~5 ms of librbd work): the
    common existence check. The object exists from early in `create`, so a complete image
    always has it, but so may the debris of a crashed create; `stat` tells them apart.
    """
    return read_id_object(io, name) or None


def read_id_object(io: rados.Ioctx, name: str) -> str | None:
    """What `rbd_id.<name>` holds (possibly '', for debris), or None when it is missing."""
    with ceph_call("look up image id", f"image {name!r}"):
        try:
            raw = io.read(f"rbd_id.{name}", 4096)
        except rados.ObjectNotFound:
            return None
    return decode_id_object(raw)


def decode_id_object(raw: bytes) -> str | None:
    """The id an `rbd_id.<name>` object holds (a Ceph string); None for a shorter object."""
    return encoding.read_string(raw)[0] if len(raw) >= 4 else None


def stat(io: rados.Ioctx, name: str, with_watchers: bool = False) -> ImageInfo | None:
    """The image's id, size and features (and watchers), or None if no complete image has
    this name. One read-only open."""
    with ceph_call("open image", f"image {name!r}"):
        try:
            with rbd.Image(io, name, read_only=True) as image:
                watchers = tuple(str(w.get("addr", "?")) for w in image.watchers_list()) if with_watchers else ()
                return ImageInfo(name, image.id(), image.size(), image.features(), watchers)
        except rbd.ImageNotFound:
            return None


def create(io: rados.Ioctx, name: str, size: int, features: tuple[str, ...], data_pool: str | None,
           with_id: bool = True) -> str:
    """Create the image and return its id ('' with `with_id=False` when the create went through
    at once: librbd does not return the id, reading it is one more round trip).

    If the name is taken, look again: a complete image (a concurrent create of the same
    volume, e.g. by another replica during a leader hand-over) is adopted, never removed;
    only the debris of a create that died half-way — which cannot hold data — is removed
    before trying once more.
    """
    mask = feature_mask(features)
    with ceph_call("create image", f"image {name!r}"):
        try:
            rbd.RBD().create(io, name, size, old_format=False, features=mask, data_pool=data_pool or None)
            if not with_id:
                return ""
        except rbd.ImageExists:
            existing = stat(io, name)
            if existing is not None:
                return existing.image_id
            completed = remove_headerless(io, name)
            if completed is not None:
                return completed.image_id
            rbd.RBD().create(io, name, size, old_format=False, features=mask, data_pool=data_pool or None)
    image_id = lookup_id(io, name)
    if image_id is None:
        raise Internal(f"image {name!r} has no id right after it was created; retry")
    return image_id


def remove_headerless(io: rados.Ioctx, name: str) -> ImageInfo | None:
    """Remove the debris of a create killed inside librbd before it wrote the image's header
    (so no data can exist): its `rbd_id.<name>` object, then its directory entry. (A create
    killed after its header but before the image could be opened goes through librbd's
    `remove`.) Returns the image, untouched, when it is complete after all: a killed client's
    last operations can still land after the look that called it debris.

    By hand, with cls_rbd's `dir_remove_image`, because `RBD.remove` takes such an image through
    the trash: killed inside it, it leaves a trash entry that nothing looks for once the name is
    free again (the retried create makes a new image under the name and the entry leaks). Here
    each step is idempotent and the id object goes first, so a crash in between leaves a
    directory entry alone, itself a partial-create shape that the retry removes."""
    raw = (omap.read_raw(io, DIRECTORY, (f"name_{name}",)) or {}).get(f"name_{name}")
    listed_id = encoding.read_string(raw)[0] if raw else ""
    image_id = read_id_object(io, name) or listed_id
    if image_id and _has_header(io, image_id):
        # Killed after its header, yet not openable: librbd's own remove, as before.
        complete = stat(io, name)
        if complete is not None:
            return complete
        log.warning("removing a partially created image", extra=fields(image=name, image_id=image_id))
        with ceph_call("remove partially created image", f"image {name!r}"):
            try:
                rbd.RBD().remove(io, name)
            except rbd.ImageNotFound:
                pass
        return None
    log.warning("removing a partially created image", extra=fields(image=name, image_id=image_id))
    with ceph_call("remove partially created image", f"image {name!r}"):
        try:
            io.remove_object(f"rbd_id.{name}")
        except rados.ObjectNotFound:
            pass
        if listed_id:
            remove_from_directory(io, name, listed_id)
    return None


def list_unlisted(io: rados.Ioctx, name: str, image_id: str) -> None:
    """Add the directory entry a create killed just before it left out (a librbd that writes the
    directory entry last, ceph/ceph PR 68612): the header and id object of `image_id` exist and
    nothing else lists the name or the id (`imagestate.ImageState.unlisted`, read by the caller
    under the volume's lease). What that librbd would have written next, so the image is then
    one like any other: listed by `rbd ls`, moved to the trash by librbd."""
    log.warning("listing an image whose create was killed before its directory entry",
                extra=fields(image=name, image_id=image_id))
    request = encoding.string(name) + encoding.string(image_id)
    with ceph_call("add a created image to the directory", f"image {name!r}"):
        try:
            io.execute(DIRECTORY, "rbd", "dir_add_image", request)
        except rados.ObjectExists:
            listed = (omap.read_raw(io, DIRECTORY, (f"name_{name}",)) or {}).get(f"name_{name}")
            if listed is None or encoding.read_string(listed)[0] != image_id:
                raise Internal(f"image {name!r} (id {image_id}) cannot be listed: the directory lists the name "
                               "or the id for another image; run `cephcsi audit` to inspect it") from None
        except rados.Error as error:
            if error_number(error) != errno.EBADF:
                raise
            raise Internal(f"image {name!r} (id {image_id}) cannot be listed: the directory lists its id under "
                           "another name; run `cephcsi audit` to inspect it") from None


def remove_from_directory(io: rados.Ioctx, name: str, image_id: str) -> None:
    """Drop the image's directory entries (name and id); a missing directory counts as done.
    The caller runs it inside its own `ceph_call`."""
    try:
        io.execute(DIRECTORY, "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))
    except rados.ObjectNotFound:
        pass


def _has_header(io: rados.Ioctx, image_id: str) -> bool:
    with ceph_call("stat image header", f"image id {image_id!r}"):
        try:
            io.stat(f"rbd_header.{image_id}")
        except rados.ObjectNotFound:
            return False
    return True
