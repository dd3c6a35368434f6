"""Where an RBD image is in its life, read from the pool's own bookkeeping objects (directory, id
object, header, trash entry and its state), including every shape a process killed inside a
librbd call leaves. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import rados

from cephcsi.ceph import encoding, images, omap
from cephcsi.ceph.batch import Batch, Pending

DIRECTORY = images.DIRECTORY
TRASH = "rbd_trash"


TRASH_SOURCE_REMOVING = 3
"""cls_rbd's trash source for an image `RBD.remove` is taking out: librbd's remove moves the
image to the trash first, then deletes it."""
TRASH_SOURCE_USER_PARENT = 4
"""cls_rbd's trash source for a parent removed while clones still read through it: librbd
itself purges it after its last child (rbd_move_parent_to_trash_on_remove)."""


class TrashState(enum.Enum):
    NORMAL = 0
    MOVING = 1
    REMOVING = 2
    RESTORING = 3


@dataclass(frozen=True)
class TrashEntry:
    image_id: str
    name: str
    state: TrashState
    source: int = 0
    """cls_rbd's trash source byte (0 user; TRASH_SOURCE_USER_PARENT for a parent awaiting its clones)."""

    @property
    def awaits_children(self) -> bool:
        return self.source == TRASH_SOURCE_USER_PARENT

    @property
    def moved_by_remove(self) -> bool:
        """Put in the trash by `RBD.remove` (a parent awaiting its clones, or an image being
        removed), not by `trash_move`: librbd resumes such a move only while the image is still
        in the directory."""
        return self.source in (TRASH_SOURCE_USER_PARENT, TRASH_SOURCE_REMOVING)


@dataclass(frozen=True)
class ImageState:
    """Every trace of one image (by name and id) in its pool."""

    name: str
    image_id: str
    """From the id object, the directory or the caller; '' when none of them knows it."""
    id_object: bool
    directory: bool
    header: bool
    trash: TrashEntry | None
    named_consistently: bool = False
    """The id object and the directory entry both map the name to `image_id`."""

    @property
    def live(self) -> bool:
        """A usable image: openable by name, not on its way to the trash."""
        return self.header and self.id_object and self.trash is None

    @property
    def partial_create(self) -> bool:
        """Debris of a create that died before it wrote the header: holds no data."""
        return (self.id_object or self.directory) and not self.header and self.trash is None

    @property
    def unlisted(self) -> bool:
        """A create killed after its header and id object, before its directory entry (a librbd
        writing the entry last): the image is whole and openable by name, but librbd's own
        trash move refuses a name the directory lacks. `images.list_unlisted` finishes it."""
        return self.header and self.id_object and not self.directory and self.trash is None

    @property
    def gone(self) -> bool:
        return not (self.id_object or self.directory or self.header or self.trash)


TRASH_SPEC_KNOWN = 2
"""The newest TrashImageSpec encoding read here (ENCODE_START(2, 1), Pacific to Tentacle)."""
TRASH_SOURCES_KNOWN = range(5)
"""cls_rbd's trash sources: user, mirroring, migration, removing, user parent."""


def decode_trash_entry(image_id: str, raw: bytes) -> TrashEntry:
    """cls_rbd TrashImageSpec: version, compat, length, source (u8), name, two utime_t,
    then (version ≥ 2) the state (u8). Version-1 entries predate states: NORMAL.

    Checked, never guessed at (encoding.UnknownEncoding): a compat version above 2, a value
    shorter than its fields, and a source or state value cls_rbd did not have when this was
    written. A version above 2 with compat ≤ 2 is read as Ceph reads it: the known fields,
    then whatever follows is skipped."""
    what = f"trash entry of image id {image_id!r}"
    spec = encoding.read_versioned(raw, what, TRASH_SPEC_KNOWN)
    encoding.require(raw, spec.start, 1, spec.end, what)
    source = raw[spec.start]
    if source not in TRASH_SOURCES_KNOWN:
        raise encoding.UnknownEncoding(f"{what} has trash source {source}, unknown to this driver")
    name, offset = encoding.read_string_within(raw, spec.start + 1, spec.end, what)
    encoding.require(raw, offset, 16, spec.end, what)  # deletion time and deferment end time
    offset += 16
    if spec.version < 2:
        return TrashEntry(image_id, name, TrashState.NORMAL, source)
    encoding.require(raw, offset, 1, spec.end, what)
    try:
        state = TrashState(raw[offset])
    except ValueError:
        raise encoding.UnknownEncoding(f"{what} has trash state {raw[offset]}, unknown to this driver") from None
    return TrashEntry(image_id, name, state, source)


def trash_entry(io: rados.Ioctx, image_id: str) -> TrashEntry | None:
    return _trash_entry_in(omap.read_raw(io, TRASH, (f"id_{image_id}",)), image_id)


def _trash_entry_in(values: dict[str, bytes] | None, image_id: str) -> TrashEntry | None:
    raw = (values or {}).get(f"id_{image_id}")
    return decode_trash_entry(image_id, raw) if raw else None


def trash_entries(io: rados.Ioctx) -> list[TrashEntry]:
    """Every trash entry of the pool (namespace), in all states."""
    values = omap.read_raw(io, TRASH) or {}
    return [decode_trash_entry(key[3:], raw) for key, raw in sorted(values.items()) if key.startswith("id_")]


def directory_names(io: rados.Ioctx) -> dict[str, str]:
    """name → id for every image in the pool's directory (including partial creates)."""
    values = omap.read_raw(io, DIRECTORY) or {}
    return {key[5:]: encoding.read_string(raw)[0] for key, raw in values.items() if key.startswith("name_")}


def trash_entry_named(io: rados.Ioctx, name: str) -> TrashEntry | None:
    """The trash entry of an image called `name` (cephcsi's image names are unique): how a
    delete finds an image that left the directory before its id was journaled."""
    for entry in trash_entries(io):
        if entry.name == name:
            return entry
    return None


def inspect(io: rados.Ioctx, name: str, known_id: str = "") -> ImageState:
    """All traces of the image `name` (id `known_id` if the caller journaled it)."""
    return Inspection(io, name, known_id).result()


class Inspection:
    """`inspect`, submitted now and read later: the traces are independent small reads, sent
    together (cephcsi.ceph.batch) so the caller can do other work while they are in flight —
    one round trip when the id is known, two when it must be found first."""

    def __init__(self, io: rados.Ioctx, name: str, known_id: str = "") -> None:
        self.io = io
        self.name = name
        self.known_id = known_id
        self._batch = Batch(io)
        self._id_object = self._batch.read(f"rbd_id.{name}", 4096)
        self._directory = self._batch.omap(DIRECTORY, (f"name_{name}",))
        self._by_id = self._traces_of(self._batch, known_id) if known_id else None

    @staticmethod
    def _traces_of(batch: Batch, image_id: str) -> tuple[Pending[bool], Pending[dict[str, bytes] | None]]:
        return batch.stat(f"rbd_header.{image_id}"), batch.omap(TRASH, (f"id_{image_id}",))

    def result(self) -> ImageState:
        self._batch.wait()
        raw_id = self._id_object.result()
        from_id_object = images.decode_id_object(raw_id) if raw_id is not None else None
        raw_entry = (self._directory.result() or {}).get(f"name_{self.name}")
        from_directory = encoding.read_string(raw_entry)[0] if raw_entry else None
        image_id = self.known_id or from_id_object or from_directory or ""
        if not image_id:
            trashed = trash_entry_named(self.io, self.name)
            image_id = trashed.image_id if trashed else ""
        by_id = self._by_id
        if by_id is None and image_id:
            batch = Batch(self.io)
            by_id = self._traces_of(batch, image_id)
            batch.wait()
        header, trash = by_id if by_id is not None else (None, None)
        return ImageState(
            name=self.name,
            image_id=image_id,
            id_object=from_id_object is not None,
            directory=from_directory is not None,
            header=header.result() if header is not None else False,
            trash=_trash_entry_in(trash.result(), image_id) if trash is not None else None,
            named_consistently=bool(image_id) and from_id_object == image_id and from_directory == image_id,
        )
