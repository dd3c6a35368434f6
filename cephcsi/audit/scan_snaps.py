"""The reads the snapshot rules need beyond the journal: each live image's RBD snapshots and which
journal leases a call holds now, from RADOS objects rather than librbd. Read-only. Design:
docs/design/audit.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import rados

from cephcsi.audit.model import ImageSnaps, RecordView, SnapJournalView
from cephcsi.ceph import encoding, omap
from cephcsi.ceph.errors import ceph_call
from cephcsi.ceph.layering import TEMP_SNAP_PREFIX
from cephcsi.volumes.journal import LOCK_NAME, SNAPSHOTS, VOLUMES
from cephcsi.volumes.snapshots import DEFAULT_PREFIX as DEFAULT_PREFIX

# cls_rbd keys of an image header: `snapshot_<id>` holds one snapshot (cls_rbd_snap: 6-byte
# encoding header, u64 snap id, then the name as u32 length + bytes), `snap_children_<id>`
# lists that snapshot's clone v2 children and is removed with the last of them. Checked
# against librbd's own writes on Ceph 16 (tests/integration/audit).
SNAPSHOT_KEY = "snapshot_"
CHILDREN_KEY = "snap_children_"
_SNAP_NAME_OFFSET = 6 + 8


def decode_snap_name(raw: bytes) -> str:
    return encoding.read_string(raw, _SNAP_NAME_OFFSET)[0]


def image_snaps_from_omap(values: Mapping[str, bytes]) -> ImageSnaps:
    names = tuple(sorted(decode_snap_name(raw) for key, raw in values.items() if key.startswith(SNAPSHOT_KEY)))
    return ImageSnaps(names, any(key.startswith(CHILDREN_KEY) for key in values))


def _header_snap_values(io: rados.Ioctx, image_id: str) -> dict[str, bytes]:
    obj = f"rbd_header.{image_id}"
    with ceph_call("read image snapshots", f"object {obj!r}"):
        try:
            with rados.ReadOpCtx() as op:
                # "snap" covers snapshot_*, snap_children_* (and snap_seq), nothing else.
                items, _ = io.get_omap_vals(op, "", "snap", -1)
                io.operate_read_op(op, obj)
                return {key: bytes(value) for key, value in items}
        except rados.ObjectNotFound:
            return {}  # removed since the listing


def read_image_snaps(io: rados.Ioctx, directory: Mapping[str, str], headers: frozenset[str],
                     trashed: set[str]) -> dict[str, ImageSnaps]:
    """image id → its snapshots, for every image with a name and a header that is not in the
    trash; images without snapshots are left out."""
    found: dict[str, ImageSnaps] = {}
    for image_id in sorted(set(directory.values())):
        if image_id not in headers or image_id in trashed:
            continue
        snaps = image_snaps_from_omap(_header_snap_values(io, image_id))
        if snaps.names or snaps.has_children:
            found[image_id] = snaps
    return found


def lease_candidates(volume_records: Mapping[str, RecordView], snap_journal: SnapJournalView,
                     directory: Mapping[str, str], image_snaps: Mapping[str, ImageSnaps]) -> list[str]:
    """Record objects whose lease decides a finding: the volumes carrying a temporary snapshot
    (a cut holds the source's lease) or pending metadata (a create holds the lease until it is
    written), and the snapshots whose image lacks its restore point (a CreateSnapshot holds its
    own lease to the end)."""
    objects: list[str] = []
    for uuid, record in sorted(volume_records.items()):
        snaps = image_snaps.get(directory.get(record.image_name, ""))
        if record.name and record.pending_metadata:
            objects.append(f"{VOLUMES.record_prefix}{uuid}")
        elif record.name and snaps and any(n.startswith(TEMP_SNAP_PREFIX) for n in snaps.names):
            objects.append(f"{VOLUMES.record_prefix}{uuid}")
    for uuid, record in sorted(snap_journal.records.items()):
        image_id = directory.get(record.image_name, "")
        if record.name and image_id and record.image_name not in image_snaps.get(image_id, ImageSnaps()).names:
            objects.append(f"{SNAPSHOTS.record_prefix}{uuid}")
    return objects


def read_leases(io: rados.Ioctx, objects: Iterable[str]) -> frozenset[str]:
    """The objects among `objects` whose journal lease (cephcsi.journal) someone holds now."""
    held: set[str] = set()
    request = omap.lock_info_request(LOCK_NAME)
    for obj in objects:
        with ceph_call("read journal lease", f"object {obj!r}"):
            try:
                _, reply = io.execute(obj, "lock", "get_info", request)
            except rados.ObjectNotFound:
                continue
        if omap.lock_is_held(reply):
            held.add(obj)
    return frozenset(held)
