"""Thin wrappers around librbd for the image operations the driver needs.

Each function opens what it needs, closes it, and translates errors through ceph_call. Images
are opened read-only for inspection: a read-only open registers no watch, so it never shows up
as a "watcher" that would block a concurrent DeleteVolume.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph.connection import Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import FailedPrecondition, NotFound
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

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


def feature_mask(features: tuple[str, ...]) -> int:
    mask = 0
    for name in features:
        mask |= FEATURE_BITS[name]
    return mask


def stat(io: rados.Ioctx, name: str) -> ImageInfo | None:
    """The image's id, size and features, or None if no complete image has this name."""
    with ceph_call("open image", f"image {name!r}"):
        try:
            with rbd.Image(io, name, read_only=True) as image:
                return ImageInfo(name=name, image_id=image.id(), size=image.size(), features=image.features())
        except rbd.ImageNotFound:
            return None


def create(io: rados.Ioctx, name: str, size: int, features: tuple[str, ...], data_pool: str | None) -> None:
    """Create the image; if a crashed earlier attempt left a partial one, remove it and retry.

    The caller has already checked (under the volume's lock) that no complete image exists.
    """
    mask = feature_mask(features)
    with ceph_call("create image", f"image {name!r}"):
        try:
            rbd.RBD().create(io, name, size, old_format=False, features=mask, data_pool=data_pool or None)
            return
        except rbd.ImageExists:
            pass
        # The name is taken but stat() found no openable image: the debris of a create that
        # died half-way. Nothing can have been written to it, so removing it loses nothing.
        log.warning("removing a partially created image", extra=fields(image=name))
        try:
            rbd.RBD().remove(io, name)
        except rbd.ImageNotFound:
            pass
        rbd.RBD().create(io, name, size, old_format=False, features=mask, data_pool=data_pool or None)


def watchers(io: rados.Ioctx, name: str) -> list[str]:
    """Addresses of clients that have the image open read-write (mapped somewhere)."""
    with ceph_call("list watchers", f"image {name!r}"):
        with rbd.Image(io, name, read_only=True) as image:
            return [str(w.get("addr", "?")) for w in image.watchers_list()]


def move_to_trash(io: rados.Ioctx, name: str) -> bool:
    """Move the image to the trash (O(1), unlike removal); False if it does not exist.

    Refuses while anyone watches the image: deleting a mapped volume would pull a disk out
    from under a running workload.
    """
    try:
        clients = watchers(io, name)
    except NotFound:
        return False
    if clients:
        raise FailedPrecondition(
            f"image {name!r} is still in use by {len(clients)} client(s) ({', '.join(clients)}); "
            "unmap it (delete the pods using the volume) before deleting the volume"
        )
    with ceph_call("move image to trash", f"image {name!r}"):
        try:
            rbd.RBD().trash_move(io, name, 0)
            return True
        except rbd.ImageNotFound:
            return False


def trash_contains(io: rados.Ioctx, image_id: str) -> bool:
    with ceph_call("list trash"):
        return any(entry["id"] == image_id for entry in rbd.RBD().trash_list(io))


def purge_from_trash(session: Session, io: rados.Ioctx, pool: str, image_id: str) -> None:
    """Remove a trashed image's data. The mgr's rbd_support module does it in the background
    (a removal is O(image objects)); if the mgr refuses, remove it inline."""
    namespace = io.get_namespace()
    spec = "/".join(part for part in (pool, namespace, image_id) if part)
    command = json.dumps({"prefix": "rbd task add trash remove", "image_id_spec": spec})
    try:
        ret, status = session.mgr_command(command)
    except Exception as error:  # noqa: BLE001 - the inline removal below is the fallback
        ret, status = -1, str(error)
    if ret == 0:
        return
    log.info("mgr did not take the trash purge; removing inline", extra=fields(image_id=image_id, reason=status))
    with ceph_call("remove image from trash", f"image id {image_id!r}"):
        try:
            rbd.RBD().trash_remove(io, image_id, force=True)
        except rbd.ImageNotFound:
            pass
