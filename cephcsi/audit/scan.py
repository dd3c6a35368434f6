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
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import rados

from cephcsi.audit import scan_groups, scan_snaps
from cephcsi.audit.model import (
    ContentView,
    ImageOwner,
    PurgeTask,
    PVView,
    RecordView,
    RemoteKeyView,
    SnapJournalView,
    Snapshot,
    TrashView,
)
from cephcsi.ceph import dependents, encoding, image_metadata, images, imagestate, omap
from cephcsi.ceph.connection import Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import CephCSIError, Internal
from cephcsi.encryption import volume_keys
from cephcsi.observability.logging import fields
from cephcsi.volumes import split_journal
from cephcsi.volumes.group_snapshots import GROUPS
from cephcsi.volumes.journal import (
    IMAGE_ID,
    IMAGE_NAME,
    PLANNED_IMAGE_ID,
    SNAPSHOTS,
    SOURCE,
    VOLUMES,
    JournalKind,
    pending_metadata_in,
)
from cephcsi.volumes.split_journal import JOURNAL_POOL, NameValue, encode_pool_id, parse_name_value, parse_pool_id

log = logging.getLogger(__name__)

ID_PREFIX = "rbd_id."
HEADER_PREFIX = "rbd_header."
GROUP_RECORD_PREFIX = GROUPS.record_prefix
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def decode_deferment(raw: bytes) -> float:
    """The deferment end (epoch seconds) of a cls_rbd TrashImageSpec: after the 6-byte
    encoding header, the source (u8) and the name come the deletion and deferment utime_t."""
    _, offset = encoding.read_string(raw, encoding.STRUCT_HEADER + 1)
    offset += 8
    if len(raw) < offset + 8:
        return 0.0
    seconds, nanoseconds = struct.unpack_from("<II", raw, offset)
    return float(seconds) + float(nanoseconds) / 1e9


def list_object_names(io: rados.Ioctx) -> list[str]:
    with ceph_call("list objects", "pool namespace"):
        return [obj.key for obj in io.list_objects()]


@dataclass(frozen=True)
class JournalKeys:
    plain: dict[str, str]
    """Our name keys whose volume is in this pool: request name → uuid."""
    foreign: frozenset[str]
    """uuids named by other instances' directories."""
    remote: dict[str, NameValue]
    """Our name keys pointing into another pool (ceph-csi's `<pool id>/<uuid>`)."""
    malformed: dict[str, str]


def read_journal(io: rados.Ioctx, names: list[str], instance_id: str, kind: JournalKind = VOLUMES) -> JournalKeys:
    ours = f"{kind.directory_prefix}{instance_id}"
    own_id = io.get_pool_id()
    keys: dict[str, str] = {}
    remote: dict[str, NameValue] = {}
    malformed: dict[str, str] = {}
    foreign: set[str] = set()
    for obj in names:
        if not obj.startswith(kind.directory_prefix):
            continue
        values = omap.read(io, obj) or {}
        for key, raw in values.items():
            if not key.startswith(kind.name_key_prefix):
                continue
            name = key[len(kind.name_key_prefix):]
            try:
                value = parse_name_value(raw, f"{obj}/{key}")
            except CephCSIError:
                if obj == ours:
                    malformed[name] = raw
                continue
            if obj != ours:
                foreign.add(value.uuid)
            elif value.elsewhere(own_id):
                remote[name] = value
            else:
                keys[name] = value.uuid
    return JournalKeys(keys, frozenset(foreign), remote, malformed)


def _image_state(io: rados.Ioctx, name: str, image_id: str) -> str:
    state = imagestate.inspect(io, name, image_id)
    if state.live:
        return "live"
    if state.trash is not None:
        return "trash"
    return "gone" if state.gone else "other"


def resolve_remote_keys(session: Session, io: rados.Ioctx, remote: dict[str, NameValue],
                        records: dict[str, RecordView]) -> dict[str, RemoteKeyView]:
    """Follow each `<pool id>/<uuid>` key to its record (here, where ceph-csi's code writes it,
    or in the image pool, where its comments put it) and to its image. Read-only."""
    own_hex = encode_pool_id(io.get_pool_id())
    resolved: dict[str, RemoteKeyView] = {}
    for name, value in sorted(remote.items()):
        assert value.image_pool_id is not None
        image_pool = session.pool_name(value.image_pool_id) or ""
        if not image_pool:
            resolved[name] = RemoteKeyView(name, value.uuid, "")
            continue
        record: RecordView | None = records.get(value.uuid)
        record_pool = session.pool_name(io.get_pool_id()) or ""
        with session.ioctx(image_pool, io.get_namespace()) as image_io:
            if record is None or record.name != name or record.journal_pool != own_hex:
                values = omap.read(image_io, f"{VOLUMES.record_prefix}{value.uuid}") or {}
                record = _record_view(value.uuid, values)
                record_pool = image_pool
            if record.name != name or record.journal_pool != own_hex:
                resolved[name] = RemoteKeyView(name, value.uuid, image_pool)
                continue
            resolved[name] = RemoteKeyView(name, value.uuid, image_pool, record_pool, record.image_name,
                                           _image_state(image_io, record.image_name, record.image_id))
    return resolved


def read_split(session: Session, io: rados.Ioctx, pool: str, instance_id: str, records: dict[str, RecordView],
               image_uuids: Iterable[str], kind: JournalKind = VOLUMES) -> tuple[dict[str, RecordView], frozenset[str]]:
    """(records ceph-csi wrote to another pool for images of this pool, uuids of records here
    whose csi.journalpool names a pool whose key points back at them), of the volume or
    snapshot journal. Read-only."""
    own_id = io.get_pool_id()
    named: set[str] = set()
    for uuid, record in records.items():
        if not record.name or not record.journal_pool:
            continue
        try:
            journal_id = parse_pool_id(record.journal_pool, f"csi.volume.{uuid}")
        except CephCSIError:
            continue
        journal_pool = session.pool_name(journal_id) if journal_id != own_id else None
        if journal_pool is None:
            continue
        key = f"{kind.name_key_prefix}{record.name}"
        with session.ioctx(journal_pool, io.get_namespace()) as journal_io:
            value = (omap.read(journal_io, f"{kind.directory_prefix}{instance_id}", (key,)) or {}).get(key)
        if value == NameValue(uuid, own_id).encode():
            named.add(uuid)
    candidates = {uuid for uuid, record in records.items() if not record.name} | set(image_uuids)
    found: dict[str, RecordView] = {}
    for uuid in sorted(candidates):
        try:
            split = split_journal.locate(session, io, pool, kind, uuid)
        except CephCSIError as error:
            # Judged as if nothing were found elsewhere; the findings' own rules still hold.
            log.warning("cannot follow a journal entry into other pools", extra=fields(uuid=uuid, error=str(error)))
            continue
        if split is not None and split.record_in_journal_pool:
            found[uuid] = RecordView(uuid, split.record.name, split.record.image_name, split.record.image_id,
                                     split.record.get(JOURNAL_POOL))
    return found, frozenset(named)


def read_records(io: rados.Ioctx, names: list[str], kind: JournalKind = VOLUMES) -> dict[str, RecordView]:
    records: dict[str, RecordView] = {}
    for obj in names:
        # "csi.volumes.<instance>" (directories) shares the first characters, not the dot;
        # so do "csi.snaps.<instance>" and "csi.snap.<uuid>".
        if not obj.startswith(kind.record_prefix) or obj.startswith(GROUP_RECORD_PREFIX):
            continue  # ("csi.volume.group.<uuid>": the group journal's, cephcsi.audit.scan_groups)
        values = omap.read(io, obj)
        if values is None:
            continue  # removed since the listing
        uuid = obj[len(kind.record_prefix):]
        records[uuid] = _record_view(uuid, values, kind)
    return records


def _record_view(uuid: str, values: dict[str, str], kind: JournalKind = VOLUMES) -> RecordView:
    name = values.get(kind.name_field, "")
    # A ceph-csi record from before csi.imagename names its image implicitly (Journal.read).
    image_name = values.get(IMAGE_NAME, "") or (f"{kind.default_image_prefix}{uuid}" if name else "")
    pending = tuple(sorted(pending_metadata_in(values.items()).items())) if kind is VOLUMES else ()
    return RecordView(uuid, name, image_name, values.get(IMAGE_ID, ""), values.get(JOURNAL_POOL, ""),
                      values.get(SOURCE, "") if kind is not VOLUMES else "", pending,
                      values.get(PLANNED_IMAGE_ID, "") if kind is VOLUMES else "",
                      values.get(volume_keys.RECORD_KMS_KEY, "") if kind is VOLUMES else "")


def read_encryption_states(io: rados.Ioctx, records: Mapping[str, RecordView], directory: Mapping[str, str],
                           notes: list[str]) -> dict[str, str]:
    """The encryption state of each listed image an encrypted volume's record names (one
    read-only open each; only encrypted volumes pay it)."""
    states: dict[str, str] = {}
    for record in records.values():
        if not record.encryption_kms or record.image_name not in directory:
            continue
        try:
            states[record.image_name] = volume_keys.state_of(image_metadata.read(io, record.image_name))
        except CephCSIError as error:
            notes.append(f"could not read the encryption state of image {record.image_name!r}: {error}")
    return states


def read_id_objects(io: rados.Ioctx, names: list[str], directory: dict[str, str]) -> dict[str, str]:
    """name → id of every rbd_id object; the directory's id is trusted when it has one, so the
    common case costs no read."""
    found: dict[str, str] = {}
    for obj in names:
        if not obj.startswith(ID_PREFIX):
            continue
        name = obj[len(ID_PREFIX):]
        image_id = directory.get(name) or images.read_id_object(io, name)
        if image_id is not None:
            found[name] = image_id
    return found


def read_trash(io: rados.Ioctx) -> tuple[TrashView, ...]:
    values = omap.read_raw(io, imagestate.TRASH) or {}
    entries = []
    for key, raw in sorted(values.items()):
        if key.startswith("id_"):
            entry = imagestate.decode_trash_entry(key[3:], raw)
            children_left = not entry.awaits_children or dependents.purged_by_librbd(io, entry.image_id)
            entries.append(TrashView(entry.image_id, entry.name, entry.state, decode_deferment(raw), entry.awaits_children,
                                     children_left))
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
                  pvs: tuple[PVView, ...] | None, mgr_timeout: float = 30.0,
                  snapshot_prefix: str = scan_snaps.DEFAULT_PREFIX,
                  contents: tuple[ContentView, ...] | None = None) -> Snapshot:
    names = list_object_names(io)
    keys = read_journal(io, names, instance_id)
    records = read_records(io, names)
    directory = imagestate.directory_names(io)
    # Images named like ours that no record here names: maybe ceph-csi journaled them elsewhere.
    claimed = {r.image_name for r in records.values() if r.name}
    unclaimed = [name[len(prefix):] for name in directory
                 if name.startswith(prefix) and name not in claimed and _UUID.match(name[len(prefix):])]
    split_records, split_named = read_split(session, io, pool, instance_id, records, unclaimed)
    notes: list[str] = []
    try:
        tasks: dict[str, PurgeTask] | None = read_tasks(session, pool, io.get_namespace(), mgr_timeout)
    except CephCSIError as error:
        # Without the task list a queued purge looks like a leak: those entries are not judged.
        log.warning("cannot read the mgr's task list", extra=fields(error=str(error)))
        notes.append(f"could not read the mgr's trash purge tasks ({error}); NORMAL trash entries were not judged")
        tasks = None
    group_keys = read_journal(io, names, instance_id, GROUPS)
    groups = scan_groups.read_groups(io, names, group_keys.plain, group_keys.foreign, notes)
    snap_keys = read_journal(io, names, instance_id, SNAPSHOTS)
    # A `<pool id>/<uuid>` snapshot key is ceph-csi's, for a snapshot in another pool: that
    # pool's audit judges it, so its uuid is not ours to judge here.
    snap_records = read_records(io, names, SNAPSHOTS)
    snap_claimed = {r.image_name for r in snap_records.values() if r.name}
    snap_unclaimed = [name[len(snapshot_prefix):] for name in directory
                      if name.startswith(snapshot_prefix) and name not in snap_claimed
                      and _UUID.match(name[len(snapshot_prefix):])]
    snap_split, snap_split_named = read_split(session, io, pool, instance_id, snap_records, snap_unclaimed,
                                              SNAPSHOTS)
    snap_journal = SnapJournalView(snapshot_prefix, snap_keys.plain,
                                   snap_keys.foreign | {value.uuid for value in snap_keys.remote.values()},
                                   snap_keys.malformed, snap_records, snap_split, snap_split_named)
    if snap_keys.remote:
        notes.append(f"{len(snap_keys.remote)} snapshot name key(s) point into other pools (ceph-csi topology); "
                     "not judged here")
    headers = frozenset(obj[len(HEADER_PREFIX):] for obj in names if obj.startswith(HEADER_PREFIX))
    trash = read_trash(io)
    image_snaps = scan_snaps.read_image_snaps(io, directory, headers, {entry.image_id for entry in trash})
    leases = scan_snaps.read_leases(io, scan_snaps.lease_candidates(records, snap_journal, directory, image_snaps))
    leases |= scan_groups.read_group_leases(io, groups)
    return Snapshot(
        prefix=prefix,
        name_keys=keys.plain,
        foreign_uuids=keys.foreign,
        remote_keys=resolve_remote_keys(session, io, keys.remote, records),
        malformed_keys=keys.malformed,
        split_records=split_records,
        split_named=split_named,
        records=records,
        encryption_states=read_encryption_states(io, records, directory, notes),
        directory=directory,
        id_objects=read_id_objects(io, names, directory),
        headers=headers,
        trash=trash,
        tasks=tasks,
        pvs=pvs,
        contents=contents,
        now=time.time(),
        notes=tuple(notes),
        snap_journal=snap_journal,
        groups=groups,
        image_snaps=image_snaps,
        leases_held=leases,
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
