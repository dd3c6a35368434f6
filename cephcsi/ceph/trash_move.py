"""Moving a live, unused image to the trash in three round trips without opening it, writing what
librbd writes in its order (so `RBD.trash_move` resumes any interrupted move); only where
`Eligibility` and cephcsi.ceph.verified allow it. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
import logging
import struct
import time
from collections.abc import Callable

import rados
import rbd

from cephcsi.ceph import encoding, images, imagestate, trash
from cephcsi.ceph.batch import Batch
from cephcsi.ceph.errors import ceph_call
from cephcsi.ceph.imagestate import TRASH, TrashState
from cephcsi.errors import CephCSIError, Internal
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

MIRRORING = "rbd_mirroring"
MOVABLE_FEATURES = (rbd.RBD_FEATURE_LAYERING | rbd.RBD_FEATURE_STRIPINGV2 | rbd.RBD_FEATURE_EXCLUSIVE_LOCK
                    | rbd.RBD_FEATURE_OBJECT_MAP | rbd.RBD_FEATURE_FAST_DIFF | rbd.RBD_FEATURE_DEEP_FLATTEN
                    | rbd.RBD_FEATURE_DATA_POOL)
"""Features an image may have for the move by hand: none of them changes what the move writes."""
NO_SNAPSHOT = 0xFFFF_FFFF_FFFF_FFFE
"""CEPH_NOSNAP: the image head, as cls_rbd's `get_features` takes it."""
TRASH_SOURCE_USER = 0
TRASH_SPEC_VERSION = 2
NOTIFY_OP_IMAGE_ADDED = 0
"""librbd trash_watcher's op for an image that entered the trash."""
"""TrashImageSpec's encoding with the entry's state (version 2, readable by version-1 decoders)."""


class Eligibility:
    """Whether image id `image_id` may be moved by hand: its features (cls_rbd `get_features`),
    whether it has a mirroring entry (`mirror_image_get`) and whether anybody watches the trash
    (who would expect librbd's notify), sent together now and read later. None of them holds op
    buffers, so nothing is lost if the caller never reads the answer (the image turned out not
    to be live, say)."""

    def __init__(self, io: rados.Ioctx, image_id: str) -> None:
        self.image_id = image_id
        self._batch = Batch(io)
        self._features = self._batch.execute(f"rbd_header.{image_id}", "rbd", "get_features",
                                             struct.pack("<Q", NO_SNAPSHOT))
        self._mirror = self._batch.execute(MIRRORING, "rbd", "mirror_image_get", encoding.string(image_id))
        self._trash_unwatched = self._batch.watch_free(TRASH)

    def result(self) -> bool:
        try:
            self._batch.wait()
            features = self._features.result()
            mirror = self._mirror.result()
            trash_unwatched = self._trash_unwatched.result()
        except CephCSIError:
            return False  # librbd's move reads the same and reports what is wrong
        if features is None or len(features) < 8 or mirror is not None or trash_unwatched is False:
            return False
        (value,) = struct.unpack_from("<Q", features)
        return not value & ~MOVABLE_FEATURES


def trash_spec(name: str, state: TrashState, now: float) -> bytes:
    """cls_rbd TrashImageSpec: source, name, deletion time, deferment end time (the same: no
    delay), state."""
    seconds, fraction = divmod(now, 1.0)
    stamp = struct.pack("<II", int(seconds), int(fraction * 1e9))
    body = bytes((TRASH_SOURCE_USER,)) + encoding.string(name) + stamp + stamp + bytes((state.value,))
    return encoding.versioned(body, version=TRASH_SPEC_VERSION)


def trash_watcher_payload(image_id: str, spec: bytes) -> bytes:
    """librbd's `rbd_trash` notify after a move (trash_watcher NotifyMessage, version 1): the op
    NOTIFY_OP_IMAGE_ADDED, the image id, and the entry as written (`trash_spec`, state NORMAL).
    Not sent by this module (why: docs/design/ceph-access.md, ceph/trash_move.py); the tests
    compare it with librbd's."""
    return encoding.versioned(struct.pack("<I", NOTIFY_OP_IMAGE_ADDED) + encoding.string(image_id) + spec)


def move(io: rados.Ioctx, name: str, image_id: str, clock: Callable[[], float] = time.time) -> None:
    """Move the live image `name` (id `image_id`, checked unused and `Eligibility` true by the
    caller, under the volume's lease) to a NORMAL trash entry."""
    add_entry(io, name, image_id, clock())
    unlist(io, name, image_id)
    trash.set_state(io, image_id, TrashState.NORMAL, expected=TrashState.MOVING)
    log.debug("moved image to the trash", extra=fields(image=name, image_id=image_id))


def add_entry(io: rados.Ioctx, name: str, image_id: str, now: float) -> None:
    """The MOVING entry first: from here on the image is found by name in the trash, as
    librbd's resume looks for it, whatever else a crash leaves."""
    request = encoding.string(image_id) + trash_spec(name, TrashState.MOVING, now)
    with ceph_call("add image to the trash", f"image {name!r}"):
        try:
            io.execute(TRASH, "rbd", "trash_add", request)
        except rados.ObjectExists:
            # An entry under this id appeared since the caller looked: not ours to take over.
            try:
                entry = imagestate.trash_entry(io, image_id)
                seen = entry.state.name if entry else "gone again"
            except encoding.UnknownEncoding as error:
                seen = error.message
            raise Internal(f"image {name!r} (id {image_id}) got a trash entry from another client "
                           f"({seen}) while it was being deleted; retry") from None


def unlist(io: rados.Ioctx, name: str, image_id: str) -> None:
    """The id object and the directory entry, together (librbd removes them one after the
    other; either order leaves a shape its resume completes). Either may be gone already."""
    batch = Batch(io)
    id_object = batch.write(f"rbd_id.{name}", "remove image id object", lambda op: op.remove(),
                            {-errno.ENOENT: False})
    request = encoding.string(name) + encoding.string(image_id)
    directory = batch.write(images.DIRECTORY, "remove image from directory",
                            lambda op: op.execute("rbd", "dir_remove_image", request), {-errno.ENOENT: False})
    batch.wait()
    id_object.result()
    directory.result()
