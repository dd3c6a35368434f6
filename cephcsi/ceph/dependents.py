"""Deleting an image that other images still read through (snapshot images, clones): the driver's
own snapshots removed, anybody else's refused by name, and the parent left in the RBD trash for
librbd to purge after its last child. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
import struct
import time
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph import image_access, imagestate, layering, trash
from cephcsi.ceph.batch import Batch
from cephcsi.ceph.errors import ceph_call
from cephcsi.ceph.imagestate import ImageState
from cephcsi.errors import CephCSIError, FailedPrecondition
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


PARENT_WATCH_WAIT = 3.0
"""How long a delete waits out watchers on an image that is a clone parent: the mgr opens the
parent read-write for a moment while it purges one of its children (measured: tens of ms), and
that watch must not fail the delete. A real user (a mapped image) still fails after this."""


@dataclass(frozen=True)
class Usage:
    """What one read-only open of an image saw: who has it open read-write, and its snapshots."""

    watchers: tuple[rbd.WatcherInfo, ...]
    snaps: list[layering.SnapInfo]


def probe(io: rados.Ioctx, name: str) -> Usage | None:
    """One read-only open of image `name` for `require_unused`, or None when it could not be
    opened (gone, half-made, or an error): the caller may probe before it knows the image's
    state, to overlap the open with other reads, and `require_unused` then opens it again
    with full error reporting. A read-only open registers no watch."""
    return image_access.if_readable(io, _usage, name)


class HeaderProbe:
    """`probe` for the common case, without the open: two reads of the header of image id
    `image_id`, sent together now and read later — does any client watch it, and does it have
    snapshots (cls_rbd `get_snapcontext`). An image with neither is unused and no clone parent
    (a clone reads through a snapshot of its parent), which is all a delete needs to know;
    anything else is left to the read-only open (`usage` returns None), which names the
    watchers and lists the snapshots."""

    def __init__(self, io: rados.Ioctx, image_id: str) -> None:
        self.image_id = image_id
        header = f"rbd_header.{image_id}"
        self._batch = Batch(io)
        self._free = self._batch.watch_free(header)
        self._snap_context = self._batch.execute(header, "rbd", "get_snapcontext")

    def usage(self) -> Usage | None:
        try:
            self._batch.wait()
            free = self._free.result()
            reply = self._snap_context.result()
        except CephCSIError:
            return None  # the open reports it, with the image's name
        if free is not True or reply is None or _snapshot_count(reply) != 0:
            return None
        return Usage((), [])


def _snapshot_count(snap_context: bytes) -> int | None:
    """The number of snapshot ids in an encoded SnapContext (u64 seq, u32 count, u64 ids)."""
    if len(snap_context) < 12:
        return None
    count: int = struct.unpack_from("<I", snap_context, 8)[0]
    return count


def _usage(image: rbd.Image) -> Usage:
    return Usage(tuple(image.watchers_list()), layering.list_snaps(image))


def _checked_usage(io: rados.Ioctx, name: str) -> Usage | None:
    with ceph_call("list image watchers and snapshots", f"image {name!r}"):
        return image_access.if_exists(io, _usage, name, read_only=True)


def require_unused(io: rados.Ioctx, name: str, first: Usage | None = None) -> list[layering.SnapInfo]:
    """trash.require_unused, tolerating the brief watch of a child purge on a parent; the
    image's snapshots as the same read-only open saw them, for `defer_if_parent` (one open of
    about 12 RADOS operations serves both checks; [] when the image is gone). `first`: what a
    `probe` of the image just saw, which saves that open."""
    deadline = time.monotonic() + PARENT_WATCH_WAIT
    usage = first if first is not None else _checked_usage(io, name)
    # Only a parent's watchers are waited out: no purge of a child explains a watch on an
    # image without snapshots.
    while usage is not None and usage.watchers and usage.snaps and time.monotonic() < deadline:
        time.sleep(0.1)
        usage = _checked_usage(io, name)
    if usage is None:
        return []
    if usage.watchers:
        trash.require_unused(io, name)  # refuses with who holds it (unless the watch just ended)
    return usage.snaps


def _remove_to_trash(io: rados.Ioctx, name: str) -> None:
    """`RBD.remove` of a parent (to the trash, USER_PARENT), waiting out a child purge's watch."""
    image_access.remove_waiting_for_watchers(io, name, PARENT_WATCH_WAIT)


def _ours(snap_name: str, image_name: str) -> bool:
    return snap_name.startswith(layering.TEMP_SNAP_PREFIX) or snap_name == image_name


def defer_if_parent(io: rados.Ioctx, state: ImageState, snaps: list[layering.SnapInfo]) -> bool:
    """For a live image whose snapshots are `snaps` (from `require_unused`, under the volume's
    journal lease, so no call of ours adds one meanwhile): drop the driver's snapshots on it; if
    clones still read through it, move it to the trash for librbd to purge after them and
    return True (nothing else to do). False: no dependents, delete it the usual way."""
    name = state.name
    if not snaps:
        return False
    user = [s for s in snaps if s.namespace == 0]
    foreign = [s.name for s in user if not _ours(s.name, name)]
    if foreign:
        raise FailedPrecondition(
            f"image {name!r} has snapshots cephcsi did not make: {', '.join(sorted(foreign))}; remove them "
            f"(rbd snap rm) or keep the image, then retry the delete"
        )
    with ceph_call("remove driver snapshots", f"image {name!r}"):
        if user:
            with rbd.Image(io, name) as image:
                for snap in user:
                    layering.remove_snap(image, snap.name)
                remaining = layering.list_snaps(image)
        else:
            remaining = snaps
        if not remaining:
            return False
        log.info("image still has clones; moving it to the trash until they are gone",
                 extra=fields(image=name, snapshots_with_children=len(remaining)))
        _remove_to_trash(io, name)
    return True


def purged_by_librbd(io: rados.Ioctx, image_id: str) -> bool:
    """The trashed image waits for its clones and librbd removes it after them: queueing a mgr
    purge would only fail and retry every few minutes meanwhile.

    Unless no clone is left: librbd purges a parent only when its last child leaves while the
    parent's entry is NORMAL, so a parent whose move a crash interrupted (finished by this
    retry) may have lost its last child in between, and nobody else would ever remove it."""
    entry = imagestate.trash_entry(io, image_id) if image_id else None
    if entry is None or not entry.awaits_children:
        return False
    with ceph_call("list snapshots of a trashed clone parent", f"image id {image_id!r}"):
        snapshotted = image_access.if_exists_by_id(io, lambda image: bool(layering.list_snaps(image)), image_id)
        return True if snapshotted is None else snapshotted  # None: librbd purged it meanwhile
