"""Read one `Snapshot` of a pool (rados namespace): journal, librbd's bookkeeping objects, the
trash and the mgr's purge tasks. Read-only: nothing here writes to the cluster.

Listing the namespace's objects is the only way to see records no key points at and headers
no name leads to, so the audit is O(objects in the namespace); it skips data objects by name
without reading them.
"""
from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Iterable

import rados

from cephcsi.audit.model import ImageOwner, PurgeTask, PVView, RecordView, Snapshot, TrashView
from cephcsi.ceph import image_metadata, imagestate, omap
from cephcsi.ceph.connection import Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import CephCSIError, Internal
from cephcsi.observability.logging import fields
from cephcsi.volumes.journal import IMAGE_ID, IMAGE_NAME, VOLUMES

log = logging.getLogger(__name__)

ID_PREFIX = "rbd_id."
HEADER_PREFIX = "rbd_header."


def decode_deferment(raw: bytes) -> float:
    """The deferment end (epoch seconds) of a cls_rbd TrashImageSpec: after the 6-byte
    encoding header, the source (u8) and the name come the deletion and deferment utime_t."""
    (length,) = struct.unpack_from("<I", raw, 7)
    offset = 7 + 4 + length + 8
    if len(raw) < offset + 8:
        return 0.0
    seconds, nanoseconds = struct.unpack_from("<II", raw, offset)
    return float(seconds) + float(nanoseconds) / 1e9


def list_object_names(io: rados.Ioctx) -> list[str]:
    with ceph_call("list objects", "pool namespace"):
        return [obj.key for obj in io.list_objects()]


def read_journal(io: rados.Ioctx, names: list[str], instance_id: str) -> tuple[dict[str, str], frozenset[str]]:
    """(our name keys: request name → uuid, uuids named by other instances' directories)."""
    ours = f"{VOLUMES.directory_prefix}{instance_id}"
    keys: dict[str, str] = {}
    foreign: set[str] = set()
    for obj in names:
        if not obj.startswith(VOLUMES.directory_prefix):
            continue
        values = omap.read(io, obj) or {}
        for key, uuid in values.items():
            if not key.startswith(VOLUMES.name_key_prefix):
                continue
            if obj == ours:
                keys[key[len(VOLUMES.name_key_prefix):]] = uuid
            else:
                foreign.add(uuid)
    return keys, frozenset(foreign)


def read_records(io: rados.Ioctx, names: list[str]) -> dict[str, RecordView]:
    records: dict[str, RecordView] = {}
    for obj in names:
        # "csi.volumes.<instance>" (directories) shares the first characters, not the dot.
        if not obj.startswith(VOLUMES.record_prefix):
            continue
        values = omap.read(io, obj)
        if values is None:
            continue  # removed since the listing
        uuid = obj[len(VOLUMES.record_prefix):]
        name = values.get(VOLUMES.name_field, "")
        # A ceph-csi record from before csi.imagename names its image implicitly (Journal.read).
        image_name = values.get(IMAGE_NAME, "") or (f"{VOLUMES.default_image_prefix}{uuid}" if name else "")
        records[uuid] = RecordView(uuid, name, image_name, values.get(IMAGE_ID, ""))
    return records


def read_id_objects(io: rados.Ioctx, names: list[str], directory: dict[str, str]) -> dict[str, str]:
    """name → id of every rbd_id object; the directory's id is trusted when it has one, so the
    common case costs no read."""
    found: dict[str, str] = {}
    for obj in names:
        if not obj.startswith(ID_PREFIX):
            continue
        name = obj[len(ID_PREFIX):]
        image_id = directory.get(name) or imagestate.id_from_id_object(io, name)
        if image_id is not None:
            found[name] = image_id
    return found


def read_trash(io: rados.Ioctx) -> tuple[TrashView, ...]:
    values = omap.read_raw(io, imagestate.TRASH) or {}
    entries = []
    for key, raw in sorted(values.items()):
        if key.startswith("id_"):
            entry = imagestate.decode_trash_entry(key[3:], raw)
            entries.append(TrashView(entry.image_id, entry.name, entry.state, decode_deferment(raw), entry.awaits_children))
    return tuple(entries)


def read_tasks(session: Session, pool: str, namespace: str, timeout: float) -> dict[str, PurgeTask]:
    """The mgr's queued `trash remove` tasks for this pool/namespace, by image id."""
    command = json.dumps({"prefix": "rbd task list", "format": "json"})
    with ceph_call("list mgr rbd tasks"):
        ret, out, status = session.rados.mgr_command(command, b"", timeout=int(max(1, timeout)))
    if ret != 0:
        raise Internal(f"the mgr refused `rbd task list` ({ret}): {status}")
    tasks: dict[str, PurgeTask] = {}
    for task in json.loads(out or b"[]"):
        refs = task.get("refs", {})
        if refs.get("action") != "trash remove" or refs.get("pool_name") != pool or \
                (refs.get("pool_namespace") or "") != namespace:
            continue
        tasks[str(refs.get("image_id", ""))] = PurgeTask(
            str(refs.get("image_id", "")), int(task.get("retry_attempts", 0) or 0), str(task.get("retry_message", "")))
    return tasks


def read_snapshot(session: Session, io: rados.Ioctx, pool: str, instance_id: str, prefix: str,
                  pvs: tuple[PVView, ...] | None, mgr_timeout: float = 30.0) -> Snapshot:
    names = list_object_names(io)
    name_keys, foreign = read_journal(io, names, instance_id)
    directory = imagestate.directory_names(io)
    notes: list[str] = []
    try:
        tasks: dict[str, PurgeTask] | None = read_tasks(session, pool, io.get_namespace(), mgr_timeout)
    except CephCSIError as error:
        # Without the task list a queued purge looks like a leak: those entries are not judged.
        log.warning("cannot read the mgr's task list", extra=fields(error=str(error)))
        notes.append(f"could not read the mgr's trash purge tasks ({error}); NORMAL trash entries were not judged")
        tasks = None
    return Snapshot(
        prefix=prefix,
        name_keys=name_keys,
        foreign_uuids=foreign,
        records=read_records(io, names),
        directory=directory,
        id_objects=read_id_objects(io, names, directory),
        headers=frozenset(obj[len(HEADER_PREFIX):] for obj in names if obj.startswith(HEADER_PREFIX)),
        trash=read_trash(io),
        tasks=tasks,
        pvs=pvs,
        now=time.time(),
        notes=tuple(notes),
    )


def read_owners(io: rados.Ioctx, images: Iterable[tuple[str, str]]) -> tuple[dict[str, ImageOwner], list[str]]:
    """The owner metadata of each (name, image id), keyed by image id: one read-only open per
    image, by id so an image in the trash is reached too. An image without owner keys is left
    out; one that cannot be opened (gone since the snapshot, a damaged header) becomes a note."""
    owners: dict[str, ImageOwner] = {}
    notes: list[str] = []
    for name, image_id in images:
        try:
            values = image_metadata.read(io, name, image_id=image_id)
        except CephCSIError as error:
            log.warning("cannot read image metadata", extra=fields(image=name, image_id=image_id, error=str(error)))
            notes.append(f"could not read the owner metadata of image {name!r} (id {image_id}): {error}")
            continue
        owner = ImageOwner.from_metadata(values)
        if owner is not None:
            owners[image_id] = owner
    return owners, notes
