"""The reads the group rules need: the group journal (`csi.groups.<instance>` →
`csi.volume.group.<uuid>`), the pool's RBD groups with their images, and which group leases a
call holds. Read-only."""
from __future__ import annotations

import rados
import rbd

from cephcsi.audit.model import GroupJournalView, GroupRecordView
from cephcsi.audit.scan_snaps import read_leases
from cephcsi.ceph import omap
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import CephCSIError
from cephcsi.volumes.group_snapshots import GROUP_NAME, GROUPS, member_ids
from cephcsi.volumes.journal import IMAGE_ID, IMAGE_NAME, Record

RECORD_PREFIX = GROUPS.record_prefix


def read_group_records(io: rados.Ioctx, names: list[str]) -> dict[str, GroupRecordView]:
    records: dict[str, GroupRecordView] = {}
    for obj in names:
        if not obj.startswith(RECORD_PREFIX):
            continue
        values = omap.read(io, obj)
        if values is None:
            continue  # removed since the listing
        uuid = obj[len(RECORD_PREFIX):]
        name = values.get(GROUPS.name_field, "")
        # As Journal.read hands the record to member_ids: without its name and image keys.
        extra = tuple(sorted((k, v) for k, v in values.items() if k not in (GROUPS.name_field, IMAGE_NAME, IMAGE_ID)))
        members = member_ids(Record(uuid, name, "", extra=extra)) if name else {}
        records[uuid] = GroupRecordView(uuid, name, values.get(GROUP_NAME, "") or f"{GROUPS.default_image_prefix}{uuid}",
                                        tuple(sorted(members.items())))
    return records


def read_rbd_groups(io: rados.Ioctx) -> dict[str, tuple[str, ...]]:
    """Every RBD group of the pool (namespace) with its images' names; a group removed since the
    listing is left out."""
    found: dict[str, tuple[str, ...]] = {}
    with ceph_call("list RBD groups", f"pool {io.get_pool_name()!r}"):
        names = sorted(str(name) for name in rbd.RBD().group_list(io))
        for name in names:
            try:
                found[name] = tuple(sorted(str(m["name"]) for m in rbd.Group(io, name).list_images()))
            except rbd.ImageNotFound:
                continue
    return found


def read_groups(io: rados.Ioctx, names: list[str], keys: dict[str, str], foreign: frozenset[str],
                notes: list[str]) -> GroupJournalView:
    records = read_group_records(io, names)
    try:
        rbd_groups: dict[str, tuple[str, ...]] | None = read_rbd_groups(io)
    except CephCSIError as error:
        notes.append(f"could not list the RBD groups ({error}); RBD groups were not judged")
        rbd_groups = None
    return GroupJournalView(GROUPS.default_image_prefix, keys, foreign, records, rbd_groups)


def group_lease_candidates(view: GroupJournalView) -> list[str]:
    """Group records whose lease decides a finding: every one (a create holds its lease from the
    record to the end), and the record object of every RBD group named like ours."""
    objects = {f"{RECORD_PREFIX}{uuid}" for uuid, record in view.records.items() if record.name}
    for group in view.rbd_groups or {}:
        uuid = view.uuid_of(group)
        if uuid:
            objects.add(f"{RECORD_PREFIX}{uuid}")
    return sorted(objects)


def read_group_leases(io: rados.Ioctx, view: GroupJournalView) -> frozenset[str]:
    return read_leases(io, group_lease_candidates(view))
