"""RBD layering for snapshots and clones: snapshots, clone v2 children, parent chains, flattens;
`clone_complete` tells a finished clone from the debris of a killed one. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph import encoding, images, trash
from cephcsi.ceph.connection import Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import CephCSIError, NotFound
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

TRASH_NAMESPACE = 2
"""rbd_snap_namespace_type_t RBD_SNAP_NAMESPACE_TYPE_TRASH."""
TEMP_SNAP_PREFIX = "cephcsi-tmp-"
"""User-namespace snapshots the driver makes on a source only for the length of one clone."""
MAX_DEPTH_WALK = 64


@dataclass(frozen=True)
class SnapInfo:
    snap_id: int
    name: str
    size: int
    namespace: int


@dataclass(frozen=True)
class ParentLink:
    pool: str
    namespace: str
    image_id: str
    snap_name: str
    """In the trash namespace (parent snapshot removed) librbd reports its uuid name."""


def list_snaps(image: rbd.Image) -> list[SnapInfo]:
    return [SnapInfo(int(s["id"]), str(s["name"]), int(s["size"]), int(s.get("namespace", 0)))
            for s in image.list_snaps()]


def user_snap(image: rbd.Image, name: str) -> SnapInfo | None:
    for snap in list_snaps(image):
        if snap.namespace == 0 and snap.name == name:
            return snap
    return None


def ensure_snap(image: rbd.Image, name: str) -> SnapInfo:
    """The user-namespace snapshot `name`, created if absent (a retry after a crash finds it)."""
    found = user_snap(image, name)
    if found is not None:
        return found
    try:
        image.create_snap(name)
    except rbd.ImageExists:
        pass
    created = user_snap(image, name)
    if created is None:
        raise CephCSIError(f"snapshot {name!r} vanished right after it was created; retry")
    return created


def remove_snap(image: rbd.Image, name: str) -> None:
    """Remove a user-namespace snapshot; with clone v2 children it moves to the trash
    namespace (the children keep reading it). Already gone counts as removed."""
    try:
        image.remove_snap(name)
    except rbd.ImageNotFound:
        pass


def snap_timestamp(image: rbd.Image, snap_id: int) -> float:
    return float(image.get_snap_timestamp(snap_id).timestamp())


def parent_link(image: rbd.Image) -> ParentLink | None:
    """Where the image's head reads through to, or None for a flat image."""
    try:
        spec = image.get_parent_image_spec()
        parent_id = image.parent_id()
    except rbd.ImageNotFound:
        return None
    return ParentLink(str(spec["pool_name"]), str(spec.get("pool_namespace", "")), str(parent_id),
                      str(spec.get("snap_name", "")))


def open_by_id(io: rados.Ioctx, image_id: str) -> rbd.Image:
    """Read-only open by id: also works for an image in the trash (a deleted parent)."""
    return rbd.Image(io, image_id=image_id, read_only=True)


def children_at(image: rbd.Image, snap_id: int) -> list[dict[str, object]]:
    """v2 children of the image's snapshot `snap_id`; the image is back at its head after."""
    image.set_snap_by_id(snap_id)
    try:
        return [dict(c) for c in image.list_children2()]
    finally:
        image.set_snap_by_id(None)


def children_of(image: rbd.Image) -> list[dict[str, object]]:
    """v2 children of every snapshot of the image (trash namespace included)."""
    found: list[dict[str, object]] = []
    for snap in list_snaps(image):
        try:
            image.set_snap_by_id(snap.snap_id)
            found.extend(dict(c) for c in image.list_children2())
        finally:
            image.set_snap_by_id(None)
    return found


CEPH_NOSNAP = (1 << 64) - 2
"""The snap id librbd and cls_rbd use for an image's head."""


@dataclass(frozen=True)
class HeaderParent:
    """What an image (head or one snapshot) reads through to, as its header records it."""

    pool_id: int
    namespace: str
    image_id: str
    snap_id: int


# cls_rbd's parent methods, decoded by hand: the bindings expose the parent only on an open image,
# and an open of a clone also opens its whole parent chain (13 RADOS reads for a flat image, 25
# at depth 1, 36 at depth 2 on Ceph 16), while the header answers the same question in two
# reads. Ceph encoding (src/cls/rbd/cls_rbd_types.cc ParentImageSpec, src/include/encoding.h):
# ENCODE_START(1, 1) = u8 version, u8 compat, u32 length; int64 pool id; strings as u32 length +
# bytes; u64 snap id; std::optional<u64> as u8 present + u64; little endian.


PARENT_SPEC_KNOWN = 1
"""The newest ParentImageSpec encoding read here (ENCODE_START(1, 1), Pacific to Tentacle)."""


def decode_parent_spec(raw: bytes) -> HeaderParent | None:
    """cls_rbd `parent_get`'s ParentImageSpec; None when the image has no parent (pool id −1).
    A compat version above 1 or a short value: encoding.UnknownEncoding (`header_parent`'s
    caller then asks librbd)."""
    what = "parent link (cls_rbd parent_get)"
    spec = encoding.read_versioned(raw, what, PARENT_SPEC_KNOWN)
    encoding.require(raw, spec.start, 8, spec.end, what)
    (pool_id,) = struct.unpack_from("<q", raw, spec.start)
    namespace, offset = encoding.read_string_within(raw, spec.start + 8, spec.end, what)
    image_id, offset = encoding.read_string_within(raw, offset, spec.end, what)
    encoding.require(raw, offset, 8, spec.end, what)
    (snap_id,) = struct.unpack_from("<Q", raw, offset)
    if pool_id < 0 or not image_id or snap_id == CEPH_NOSNAP:
        return None
    return HeaderParent(pool_id, namespace, image_id, snap_id)


def decode_overlap(raw: bytes) -> int | None:
    """cls_rbd `parent_overlap_get`'s std::optional<u64> (not a versioned struct: a presence
    byte, then the value): None when that head or snapshot has no parent (never had one, or
    flattened). Anything but those two shapes: encoding.UnknownEncoding."""
    if not raw or (raw[0] == 0 and len(raw) == 1):
        return None
    if raw[0] != 1 or len(raw) != 9:
        raise encoding.UnknownEncoding(f"parent overlap (cls_rbd parent_overlap_get): unexpected {len(raw)}-byte value")
    return int(struct.unpack_from("<Q", raw, 1)[0])


def header_parent(io: rados.Ioctx, image_id: str, snap_id: int = CEPH_NOSNAP) -> HeaderParent | None:
    """The parent the image's head (or snapshot `snap_id`) reads through, from its header: two
    reads, no image open. None for flat storage. An image whose header is gone (a parent purged
    meanwhile) ends the chain; a snapshot the header does not list falls back to the head, as
    the open-based walk did."""
    header = f"rbd_header.{image_id}"
    with ceph_call("read parent link", f"image id {image_id!r}"):
        try:
            _, raw = io.execute(header, "rbd", "parent_overlap_get", struct.pack("<Q", snap_id))
        except rados.ObjectNotFound:
            return None if snap_id == CEPH_NOSNAP else header_parent(io, image_id)
        if decode_overlap(raw) is None:
            return None
        try:
            _, raw = io.execute(header, "rbd", "parent_get", b"")
        except rados.ObjectNotFound:
            return None
    return decode_parent_spec(raw)


@contextmanager
def _parent_pool(session: Session, io: rados.Ioctx, link: HeaderParent) -> Iterator[rados.Ioctx | None]:
    """An ioctx on the link's pool and namespace: `io` itself when it is the same (the usual
    case), None when that pool is gone."""
    if link.pool_id == io.get_pool_id() and link.namespace == io.get_namespace():
        yield io
        return
    pool = session.pool_name(link.pool_id)
    if pool is None:
        yield None
        return
    with session.ioctx(pool, link.namespace) as parent_io:
        yield parent_io


def depth(session: Session, io: rados.Ioctx, image_id: str) -> int:
    """Number of images between this one's head and flat storage (its clone-chain depth).

    Each step follows the parent *of the snapshot the child reads through*, not the parent's
    head: an image flattened without deep-flatten (restored and cloned volumes) has a flat head
    while its older snapshots still read through its old parent, and a child cut from such a
    snapshot is as deep as that snapshot's chain. Read from the headers (two reads a level),
    or by librbd where a header answers in an encoding this driver does not know."""
    count = 0
    link = _parent(session, io, image_id, CEPH_NOSNAP)
    while link is not None:
        count += 1
        if count >= MAX_DEPTH_WALK:
            return count
        with _parent_pool(session, io, link) as parent_io:
            link = None if parent_io is None else _parent(session, parent_io, link.image_id, link.snap_id)
    return count


def _parent(session: Session, io: rados.Ioctx, image_id: str, snap_id: int) -> HeaderParent | None:
    try:
        return header_parent(io, image_id, snap_id)
    except encoding.UnknownEncoding as error:
        log.info("reading a parent link through librbd", extra=fields(image_id=image_id, reason=error.message))
        return parent_by_open(session, io, image_id, snap_id)


def parent_by_open(session: Session, io: rados.Ioctx, image_id: str, snap_id: int = CEPH_NOSNAP) -> HeaderParent | None:
    """`header_parent`, asked of librbd (a read-only open of the image and of its parent): what
    the driver falls back to when cls_rbd's answer is in an encoding it does not know."""
    with ceph_call("read parent link", f"image id {image_id!r}"):
        try:
            with open_by_id(io, image_id) as image:
                if snap_id != CEPH_NOSNAP:
                    try:
                        image.set_snap_by_id(snap_id)
                    except rbd.ImageNotFound:
                        pass  # a snapshot the image no longer has: its head, as header_parent does
                try:
                    spec = image.get_parent_image_spec()
                    parent_id = str(image.parent_id())
                except rbd.ImageNotFound:
                    return None
        except rbd.ImageNotFound:
            return None
        pool_id = session.rados.pool_lookup(spec["pool_name"])
    if pool_id is None or pool_id < 0:
        return None
    namespace = str(spec.get("pool_namespace", ""))
    with session.ioctx(spec["pool_name"], namespace) as parent_io, ceph_call("list parent snapshots", parent_id):
        try:
            with open_by_id(parent_io, parent_id) as parent:
                snaps = list_snaps(parent)
        except rbd.ImageNotFound:
            return None
    snap = next((s for s in snaps if s.name == spec["snap_name"]), None)
    return HeaderParent(int(pool_id), namespace, parent_id, snap.snap_id if snap else CEPH_NOSNAP)


def clone_complete(io: rados.Ioctx, name: str, parent_id: str | None, parent_io: rados.Ioctx) -> bool | None:
    """None: no image `name`. True: a finished clone (of `parent_id`, when given) whose link
    the parent's snapshot lists (so removing that snapshot keeps it in the trash namespace).
    False: debris of a clone killed inside librbd (no parent link, or one the parent does not
    list). `parent_io` is the parent's pool."""
    if images.lookup_id(io, name) is None:
        # No id object, no image and no debris (a clone writes it first): one read instead of a
        # failing open (which costs ~2 ms of librbd work).
        return None
    try:
        with rbd.Image(io, name, read_only=True) as child:
            child_id = str(child.id())
            link = parent_link(child)
    except rbd.ImageNotFound:
        return None
    if link is None or (parent_id is not None and link.image_id != parent_id):
        return False
    with open_by_id(parent_io, link.image_id) as parent:
        for snap in list_snaps(parent):
            if snap.name != link.snap_name:
                continue
            parent.set_snap_by_id(snap.snap_id)
            try:
                listed = {str(c.get("id")) for c in parent.list_children2()}
            finally:
                parent.set_snap_by_id(None)
            return child_id in listed
    return False


def finished_clone(session: Session, io: rados.Ioctx, name: str) -> bool:
    """`name` exists and is a finished clone of whatever parent it links to."""
    if images.lookup_id(io, name) is None:
        return False  # see clone_complete: nothing, not even debris, has this name
    with ceph_call("inspect clone", f"image {name!r}"):
        try:
            with rbd.Image(io, name, read_only=True) as child:
                link = parent_link(child)
        except rbd.ImageNotFound:
            return False
        if link is None:
            return False
        with session.ioctx(link.pool, link.namespace) as parent_io:
            return bool(clone_complete(io, name, link.image_id, parent_io))


def clone(session: Session, parent_io: rados.Ioctx, parent_name: str, snap_name: str, io: rados.Ioctx, name: str,
          features: int, data_pool: str | None, parent_id: str = "") -> None:
    """Clone parent@snap to `name` (format 2: set on the connection). An existing finished clone
    is kept; debris of a killed clone is removed first (it holds no data of its own).
    `parent_id`: the parent's id when the caller has the parent open already (saves an open)."""
    parent_id = parent_id or _image_id(parent_io, parent_name)
    state = clone_complete(io, name, parent_id, parent_io)
    if state:
        return
    if state is False:
        log.warning("removing an interrupted clone", extra=fields(image=name))
        remove_debris(io, name)
    with session.creating_in(io, data_pool), ceph_call("clone image", f"image {name!r} from {parent_name}@{snap_name}"):
        try:
            rbd.RBD().clone(parent_io, parent_name, snap_name, io, name, features=features,
                            data_pool=data_pool or None)
        except rbd.ImageExists:
            # A clone killed before it wrote the header leaves a name that cannot be opened.
            log.warning("removing a partially created clone", extra=fields(image=name))
            remove_debris(io, name)
            rbd.RBD().clone(parent_io, parent_name, snap_name, io, name, features=features,
                            data_pool=data_pool or None)


def remove_debris(io: rados.Ioctx, name: str) -> None:
    """Remove an image known to hold no data of its own (an interrupted create or clone).
    A header-less image cannot be opened, so its snapshots (none) are skipped, not an error."""
    with ceph_call("remove interrupted image", f"image {name!r}"):
        try:
            with rbd.Image(io, name) as image:
                for snap in list_snaps(image):
                    if snap.namespace == 0:
                        image.remove_snap(snap.name)
        except rbd.ImageNotFound:
            pass
        try:
            rbd.RBD().remove(io, name)
        except rbd.ImageNotFound:
            pass
    # This call's own remove, or an earlier attempt's, may have been killed inside librbd.
    trash.finish_removal(io, name)


def _image_id(io: rados.Ioctx, name: str) -> str:
    with ceph_call("open image", f"image {name!r}"):
        try:
            with rbd.Image(io, name, read_only=True) as image:
                return str(image.id())
        except rbd.ImageNotFound:
            raise NotFound(f"image {name!r} does not exist") from None


def queue_flatten(session: Session, pool: str, namespace: str, name: str) -> bool:
    """Ask the mgr to flatten the image in the background (it de-duplicates repeated asks and
    retries failures). False when the mgr refused; the caller's request never waits for it."""
    spec = "/".join(part for part in (pool, namespace, name) if part)
    command = json.dumps({"prefix": "rbd task add flatten", "image_spec": spec})
    try:
        ret, status = session.mgr_command(command)
    except CephCSIError as error:
        ret, status = -1, error.message
    if ret != 0:
        log.warning("mgr did not take the flatten; the policy retries on the next request",
                    extra=fields(image=spec, reason=status))
        return False
    log.info("flatten queued with the mgr", extra=fields(image=spec))
    return True
