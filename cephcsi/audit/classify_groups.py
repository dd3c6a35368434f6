"""The group journal's rules: group snapshots whose create never finished, RBD groups no record
names, and member snapshots of a group that is gone. Pure, no I/O.

What the create leaves where (cephcsi.volumes.group_snapshots): name key → group record with its
member map → member snapshot records → RBD group holding the sources → group snapshot → member
copies → RBD group removed. So an RBD group exists only while its record does, and a member
record only after its group record: anything else a kill cannot leave, and the audit says so.
"""
from __future__ import annotations

from dataclasses import replace

from cephcsi.audit.journal_rules import image_id_of, image_is_live
from cephcsi.audit.model import RECORD_PREFIXES, Finding, Fix, GroupRecordView, ImageSnaps, JournalType, Kind, Snapshot

UNFINISHED_WHY_NOT = ("a retry of the same CreateVolumeGroupSnapshot finishes it and its DeleteVolumeGroupSnapshot "
                      "removes it (RBD group and members); the audit cannot tell a request still retried from one "
                      "given up, and its members may hold the only copy of that instant")
MEMBER_WHY_NOT = ("a snapshot image with data, which a VolumeSnapshotContent may name: delete it with the driver's "
                  "DeleteSnapshot (or its VolumeSnapshot) if nobody needs it")


def group_findings(snap: Snapshot) -> list[Finding]:
    return [*group_keys(snap), *unfinished_groups(snap), *orphan_rbd_groups(snap), *orphan_members(snap)]


def group_keys(snap: Snapshot) -> list[Finding]:
    """Name keys whose record is missing or empty (a create killed between its reservation and
    its record), and empty record objects no key names (a lock a killed create left): released
    and removed as the volume journal's are, under the entry's lease, which a create in flight
    holds (the repair then finds it busy)."""
    groups = snap.groups
    found: list[Finding] = []
    for name, uuid in sorted(groups.name_keys.items()):
        record = groups.records.get(uuid)
        if record is None or not record.name:
            found.append(Finding(Kind.DANGLING_KEY, name, f"group name key points at group record {uuid}, which "
                                 f"{'holds no name' if record else 'does not exist'}", uuid=uuid, name=name,
                                 journal=JournalType.GROUP, fix=Fix.RELEASE_KEY))
    keyed = set(groups.name_keys.values()) | groups.foreign_uuids
    for uuid, record in sorted(groups.records.items()):
        if not record.name and uuid not in keyed:
            found.append(Finding(Kind.ORPHAN_RECORD, f"{RECORD_PREFIXES[JournalType.GROUP]}{uuid}", "empty group "
                                 "record object (a lock left by a killed create) that no name key points at",
                                 uuid=uuid, journal=JournalType.GROUP, fix=Fix.REMOVE_RECORD))
    return found


def member_finished(snap: Snapshot, image_name: str) -> bool:
    """A member is done once its snapshot image is live with its restore point (a user snapshot
    named like the image), as the driver's create checks it."""
    journal = snap.snap_journal
    record = journal.records.get(journal.uuid_of(image_name))
    image_id = image_id_of(snap, record) if record is not None and record.name else snap.directory.get(image_name, "")
    return image_is_live(snap, image_name, image_id) and \
        image_name in snap.image_snaps.get(image_id, ImageSnaps()).names


def _is_busy(snap: Snapshot, uuid: str) -> bool:
    return f"{RECORD_PREFIXES[JournalType.GROUP]}{uuid}" in snap.leases_held


def unfinished_groups(snap: Snapshot) -> list[Finding]:
    """Named group records of this instance whose RBD group is still there or whose members are
    not all done, and no call holds their lease (a create in flight holds it to the end)."""
    groups = snap.groups
    found: list[Finding] = []
    keyed = {uuid: name for name, uuid in groups.name_keys.items()}
    for uuid, record in sorted(groups.records.items()):
        if not record.name or uuid in groups.foreign_uuids or _is_busy(snap, uuid):
            continue
        pending = sorted(image for _, image in record.members if not member_finished(snap, image))
        in_group = None if groups.rbd_groups is None else groups.rbd_groups.get(record.rbd_group)
        if not pending and in_group is None:
            continue
        found.append(_unfinished(record, pending, in_group, keyed.get(uuid) == record.name))
    return found


def _unfinished(record: GroupRecordView, pending: list[str], in_group: tuple[str, ...] | None,
                keyed: bool) -> Finding:
    parts = []
    if in_group is not None:
        held = f"still holds source image(s) {', '.join(in_group)}" if in_group else "holds no image"
        parts.append(f"its RBD group {record.rbd_group!r} {held}")
    if pending:
        parts.append(f"{len(pending)} of {len(record.members)} member snapshot(s) unfinished ({', '.join(pending)})")
    key = "" if keyed else "; no name key points at the record (a delete killed after releasing it)"
    return Finding(Kind.UNFINISHED_GROUP, record.name, f"group snapshot record {record.uuid}: "
                   f"{'; '.join(parts)}: a CreateVolumeGroupSnapshot killed before it finished{key}",
                   uuid=record.uuid, name=record.name, journal=JournalType.GROUP, why_not=UNFINISHED_WHY_NOT)


def orphan_rbd_groups(snap: Snapshot) -> list[Finding]:
    """RBD groups named prefix + uuid that no named group record claims (a record names its group
    in csi.groupname, so a custom groupNamePrefix's group is claimed by its record)."""
    groups = snap.groups
    if groups.rbd_groups is None:
        return []
    claimed = {r.rbd_group for r in groups.records.values() if r.name and r.rbd_group}
    found: list[Finding] = []
    for name, members in sorted(groups.rbd_groups.items()):
        uuid = groups.uuid_of(name)
        if not uuid or name in claimed:
            continue
        held = f"holds image(s) {', '.join(members)}" if members else "holds no image"
        detail = (f"RBD group named like the driver's temporary group ({held}) that no group snapshot record "
                  "names; removing the group leaves every image as it is")
        if uuid in groups.foreign_uuids or _is_busy(snap, uuid):
            found.append(Finding(Kind.ORPHAN_RBD_GROUP, name, detail, uuid=uuid, journal=JournalType.GROUP,
                                 why_not="a group snapshot call holds its entry right now"))
            continue
        found.append(Finding(Kind.ORPHAN_RBD_GROUP, name, detail, uuid=uuid, journal=JournalType.GROUP,
                             fix=Fix.REMOVE_RBD_GROUP))
    return found


def member_group_name(request_name: str, uuid: str) -> str:
    """The group snapshot request a member snapshot's request name (`<group name>-<its uuid>`)
    was made for; '' for any other snapshot."""
    suffix = f"-{uuid}"
    return request_name[:-len(suffix)] if uuid and request_name.endswith(suffix) and \
        len(request_name) > len(suffix) else ""


def orphan_members(snap: Snapshot) -> list[Finding]:
    """Member snapshot records whose group snapshot neither a name key nor a record knows. The
    driver writes a member's record after its group's and removes it before: only a hand edit
    or another tool leaves one, so it is only reported."""
    groups = snap.groups
    named = set(groups.name_keys) | {r.name for r in groups.records.values() if r.name}
    listed = {image for r in groups.records.values() for _, image in r.members}
    found: list[Finding] = []
    for uuid, record in sorted(snap.snap_journal.records.items()):
        group = member_group_name(record.name, uuid)
        if not group or group in named or record.image_name in listed:
            continue
        found.append(Finding(Kind.ORPHAN_GROUP_MEMBER, record.name, f"member snapshot {uuid} (image "
                             f"{record.image_name!r}) of group snapshot {group!r}, which the group journal does "
                             "not know", uuid=uuid, name=record.name, image_name=record.image_name,
                             journal=JournalType.SNAPSHOT, why_not=MEMBER_WHY_NOT))
    return found


MEMBER_BLOCK = ("member snapshot of group snapshot {group!r}, whose CreateVolumeGroupSnapshot retry rewrites "
                "its record and whose DeleteVolumeGroupSnapshot removes it: left to them")
_JOURNAL_FIXES = frozenset({Fix.REMOVE_RECORD, Fix.RELEASE_KEY})


def member_blocks(snap: Snapshot, findings: list[Finding]) -> list[Finding]:
    """`findings` without the journal repairs of member snapshots a group record lists (a member
    record whose image is not made yet reads as dangling): a group create in flight holds the
    group's lease, not the member's, between writing the record and cutting the member. Debris
    (a partial copy, the trash) is still repaired: the driver removes it the same way."""
    owners = {image: r.name for r in snap.groups.records.values() if r.name for _, image in r.members}
    by_uuid = {uuid: record.image_name for uuid, record in snap.snap_journal.records.items()}
    blocked: list[Finding] = []
    for finding in findings:
        image = finding.image_name or by_uuid.get(finding.uuid, "")
        group = owners.get(image) if finding.journal is JournalType.SNAPSHOT and finding.fix in _JOURNAL_FIXES \
            else None
        blocked.append(replace(finding, fix=None, why_not=MEMBER_BLOCK.format(group=group)) if group else finding)
    return blocked
