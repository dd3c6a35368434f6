"""Snapshot → findings: pure functions, no I/O, so every rule is unit-tested on its own.

The rules only call something a problem when no operation of the driver can be in the middle
of producing it *and* finishing it by itself (a NORMAL trash entry with a queued purge is a
delete in progress, not a finding). A snapshot can still catch a create or delete between two
steps; that is why `--repair` re-checks every finding under the volume's journal lock.
"""
from __future__ import annotations

from dataclasses import replace

from cephcsi.audit import classify_groups, classify_snaps
from cephcsi.audit.journal_rules import image_id_of, image_is_live, journal_findings, pv_block, trash_by_id
from cephcsi.audit.model import Finding, Fix, JournalType, Kind, Snapshot, TrashView
from cephcsi.ceph.imagestate import TrashState

NO_KUBE = "no --kubeconfig given, so no PV can be ruled out"


def classify(snap: Snapshot) -> list[Finding]:
    findings = [
        *journal_findings(snap),
        *classify_snaps.snapshot_journal_findings(snap),
        *image_findings(snap),
        *classify_snaps.temp_snapshot_findings(snap),
        *trash_findings(snap),
        *pv_findings(snap),
        *classify_snaps.content_findings(snap),
        *classify_groups.group_findings(snap),
    ]
    findings = classify_groups.member_blocks(snap, findings)
    return sorted(classify_snaps.content_blocks(snap, findings), key=lambda f: (f.kind.value, f.subject))


def _claimed_images(snap: Snapshot) -> set[str]:
    records = [*snap.records.values(), *snap.split_records.values(), *snap.snap_journal.records.values(),
               *snap.snap_journal.split_records.values()]
    return {r.image_name for r in records if r.name and r.image_name}


def image_owner(snap: Snapshot, name: str) -> tuple[JournalType | None, str]:
    """(journal, uuid) of a name the driver would give a volume or snapshot image; (None, '')."""
    uuid = snap.uuid_of(name)
    if uuid:
        return JournalType.VOLUME, uuid
    uuid = snap.snap_journal.uuid_of(name)
    return (JournalType.SNAPSHOT, uuid) if uuid else (None, "")


def image_findings(snap: Snapshot) -> list[Finding]:
    """Orphan images, partial creates and headers nothing leads to."""
    found: list[Finding] = []
    trash = trash_by_id(snap)
    claimed = _claimed_images(snap)
    for name in sorted(set(snap.directory) | set(snap.id_objects)):
        image_id = snap.directory.get(name) or snap.id_objects.get(name, "")
        journal, uuid = image_owner(snap, name)
        if image_id in trash:
            continue  # a trash move in progress or interrupted: judged with the trash
        if image_id not in snap.headers:
            found.append(_partial_create(name, image_id, uuid, journal))
        elif name not in snap.directory:
            found.append(_unlisted(name, image_id, uuid, journal))
        elif uuid and journal and name not in claimed and name in snap.id_objects:
            found.append(replace(_orphan_image(snap, name, image_id, uuid, journal), journal=journal))
    # A header written under a record's planned id is that record's: a killed create's, which
    # the record's own finding settles (repair.remove_record), not a stray one.
    planned = {r.planned_image_id for r in snap.records.values() if r.planned_image_id and not r.image_id}
    reachable = set(snap.directory.values()) | set(snap.id_objects.values()) | set(trash) | planned
    for image_id in sorted(snap.headers - reachable):
        found.append(Finding(Kind.STRAY_HEADER, f"rbd_header.{image_id}", "image header with no name and no "
                             "trash entry (it may hold data)", image_id=image_id, ours=False, journal=None,
                             why_not="holds data and names no owner; inspect it with `rados listomapvals`"))
    return found


def _partial_create(name: str, image_id: str, uuid: str, journal: JournalType | None) -> Finding:
    return Finding(Kind.PARTIAL_CREATE, name, f"directory entry or id object (id {image_id or '?'}) without an "
                   "image header: the debris of a create that was killed (holds no data)",
                   uuid=uuid, image_name=name, image_id=image_id, ours=bool(uuid), journal=journal,
                   fix=Fix.REMOVE_PARTIAL if uuid else None,
                   why_not="" if uuid else "not named like this driver's images")


def _unlisted(name: str, image_id: str, uuid: str, journal: JournalType | None) -> Finding:
    return Finding(Kind.UNLISTED_IMAGE, name, f"image header and id object (id {image_id}) without a directory "
                   "entry: a create killed just before it listed the image", uuid=uuid, image_name=name,
                   image_id=image_id, ours=bool(uuid), journal=journal, fix=Fix.LIST_IMAGE if uuid else None,
                   why_not="" if uuid else "not named like this driver's images")


READ_THROUGH = "restored or cloned volumes read through its snapshots: it is never moved or removed"


def _orphan_image(snap: Snapshot, name: str, image_id: str, uuid: str, journal: JournalType) -> Finding:
    what = "snapshot image" if journal is JournalType.SNAPSHOT else "image"
    detail = f"{what} named like this driver's with no journal record"
    children = snap.image_snaps.get(image_id)
    if children is not None and children.has_children:
        # Moving it would leave its clones reading through a trashed image that nothing owns.
        return Finding(Kind.ORPHAN_IMAGE, name, f"{detail} (a clone parent)", uuid=uuid, image_name=name,
                       image_id=image_id, why_not=READ_THROUGH)
    if snap.pvs is None:
        return Finding(Kind.ORPHAN_IMAGE, name, detail, uuid=uuid, image_name=name, image_id=image_id,
                       why_not=NO_KUBE)
    blocked = pv_block(snap, uuid, name)
    if blocked:
        return Finding(Kind.ORPHAN_IMAGE, name, f"{detail} ({blocked})", uuid=uuid, image_name=name,
                       image_id=image_id, why_not=blocked)
    return Finding(Kind.ORPHAN_IMAGE, f"{name}", f"{detail} and no PersistentVolume", uuid=uuid,
                   image_name=name, image_id=image_id, fix=Fix.TRASH_ORPHAN)


def _owner_uuid(snap: Snapshot, entry: TrashView) -> tuple[JournalType | None, str]:
    """The journal and uuid a trash entry belongs to: from its name, or a record holding its id."""
    journal, uuid = image_owner(snap, entry.name)
    if uuid:
        return journal, uuid
    for journal, records in ((JournalType.VOLUME, snap.records), (JournalType.SNAPSHOT, snap.snap_journal.records)):
        uuid = next((r.uuid for r in records.values() if r.image_id and r.image_id == entry.image_id), "")
        if uuid:
            return journal, uuid
    return None, ""


def trash_findings(snap: Snapshot) -> list[Finding]:
    found: list[Finding] = []
    for entry in snap.trash:
        journal, uuid = _owner_uuid(snap, entry)
        finding = _trash_finding(snap, entry, uuid)
        if finding is not None:
            found.append(replace(finding, journal=journal))
    return found


def _trash_finding(snap: Snapshot, entry: TrashView, uuid: str) -> Finding | None:
    task = None if snap.tasks is None else snap.tasks.get(entry.image_id)
    failing = f"; the mgr's purge fails: {task.message}" if task and task.attempts else ""
    blocked = "not this driver's image" if not uuid else pv_block(snap, uuid, entry.name)
    base = Finding(Kind.TRASH_MOVING, f"trash:{entry.image_id}", "", uuid=uuid, image_name=entry.name,
                   image_id=entry.image_id, ours=bool(uuid), why_not=blocked)

    def finding(kind: Kind, detail: str, fix: Fix | None) -> Finding:
        return replace(base, kind=kind, detail=f"{entry.name!r} {detail}", fix=None if blocked else fix)

    if entry.state is TrashState.MOVING:
        return finding(Kind.TRASH_MOVING, f"is half moved to the trash (state MOVING)"
                       f"{failing or '; the mgr cannot purge it'}", Fix.FINISH_MOVE)
    if snap.tasks is None or entry.state is TrashState.RESTORING:
        return None  # no task list: an unqueued entry cannot be told from a queued one
    if entry.state is TrashState.REMOVING:
        if task and not task.attempts:
            return None  # the mgr is purging it right now
        return finding(Kind.TRASH_REMOVING, f"is half removed (state REMOVING){failing or ' and no purge is queued'}",
                       Fix.PURGE)
    if entry.deferred_until > snap.now:
        return None  # deferred on purpose (e.g. an orphan moved by --repair-orphan-images)
    if entry.awaits_children and entry.children_left:
        return None  # a deleted parent: librbd purges it once its last clone is gone
    if entry.awaits_children and task is None:
        # librbd purges a parent only as its last clone leaves; this one missed that moment.
        return finding(Kind.TRASH_UNQUEUED, "is a deleted clone parent whose clones are all gone, and nothing will "
                       "purge it", Fix.PURGE)
    if task and task.attempts:
        return replace(finding(Kind.TRASH_UNPURGEABLE, f"is in the trash{failing}", None),
                       why_not="the mgr keeps retrying; fix the cause it reports")
    if task is None and uuid:
        return finding(Kind.TRASH_UNQUEUED, "is in the trash and no purge is queued", Fix.PURGE)
    return None


def pv_findings(snap: Snapshot) -> list[Finding]:
    """Only with a kubeconfig; reported, never repaired: a PV is a person's decision."""
    if snap.pvs is None:
        return []
    found: list[Finding] = []
    for pv in snap.pvs:
        if not pv.uuid:
            continue  # a static PV: its image is named by imageName and only protects it
        record = snap.record(pv.uuid)
        if record is None or not record.name:
            found.append(Finding(Kind.PV_IMAGE_GONE, pv.name, f"names volume {pv.uuid}, which the journal "
                                 "does not know", uuid=pv.uuid, why_not="a PV is never repaired"))
        elif not image_is_live(snap, record.image_name, image_id_of(snap, record)):
            found.append(Finding(Kind.PV_IMAGE_GONE, pv.name, f"names image {record.image_name!r}, which is "
                                 f"not there (phase {pv.phase or '?'})", uuid=pv.uuid, name=record.name,
                                 image_name=record.image_name, why_not="a PV is never repaired"))
    named = {pv.uuid for pv in snap.pvs}
    for name, uuid in sorted(snap.name_keys.items()):
        record = snap.records.get(uuid)
        if record and record.name == name and uuid not in named and \
                image_is_live(snap, record.image_name, image_id_of(snap, record)):
            found.append(Finding(Kind.IMAGE_WITHOUT_PV, record.image_name, f"journaled for {name!r} but no "
                                 "PersistentVolume names it", uuid=uuid, name=name, image_name=record.image_name,
                                 why_not="delete it through its claim, or with the driver's DeleteVolume"))
    return found
