"""The snapshot journal's rules, temporary snapshots, unfinished snapshot images and
VolumeSnapshotContents: pure, judged with the journal rules (cephcsi.audit.journal_rules) on a
view that puts the snapshot journal in the volume journal's place. Design: docs/design/audit.md.
"""
from __future__ import annotations

from dataclasses import replace

from cephcsi.audit.journal_rules import image_id_of, image_is_live, journal_findings
from cephcsi.audit.model import RECORD_PREFIXES, ContentView, Finding, Fix, ImageSnaps, JournalType, Kind, RecordView, Snapshot
from cephcsi.ceph.layering import TEMP_SNAP_PREFIX


def snapshot_view(snap: Snapshot) -> Snapshot:
    """`snap` with the snapshot journal in the volume journal's place. No PVs: a PV names a
    volume, never a snapshot; and no name keys into other pools (left out by the scan: that
    pool's audit judges them), but the records ceph-csi split off for snapshot images here."""
    journal = snap.snap_journal
    return replace(snap, prefix=journal.prefix, name_keys=journal.name_keys, foreign_uuids=journal.foreign_uuids,
                   remote_keys={}, malformed_keys=journal.malformed_keys, split_records=journal.split_records,
                   split_named=journal.split_named, records=journal.records, pvs=None, journal=JournalType.SNAPSHOT)


def snapshot_journal_findings(snap: Snapshot) -> list[Finding]:
    return [*journal_findings(snapshot_view(snap)), *unfinished_findings(snap)]


UNFINISHED_WHY_NOT = ("a retry of the same CreateSnapshot finishes it, and its DeleteSnapshot removes it; "
                      "the audit cannot tell a request still retried from one given up")


def unfinished_findings(snap: Snapshot) -> list[Finding]:
    """Journaled snapshots whose live image lacks its restore point, with no call on them."""
    journal = snap.snap_journal
    found: list[Finding] = []
    for name, uuid in sorted(journal.name_keys.items()):
        record = journal.records.get(uuid)
        if record is None or record.name != name:
            continue  # judged by the journal rules
        image_id = image_id_of(snap, record)
        if not image_is_live(snap, record.image_name, image_id):
            continue
        if record.image_name in snap.image_snaps.get(image_id, ImageSnaps()).names:
            continue
        if f"{RECORD_PREFIXES[JournalType.SNAPSHOT]}{uuid}" in snap.leases_held:
            continue  # a CreateSnapshot is between its clone and its restore point right now
        found.append(Finding(
            Kind.UNFINISHED_SNAPSHOT, name, f"snapshot image {record.image_name!r} has no restore point (RBD "
            f"snapshot {record.image_name!r}): a CreateSnapshot killed after its clone", uuid=uuid, name=name,
            image_name=record.image_name, image_id=image_id, journal=JournalType.SNAPSHOT,
            why_not=UNFINISHED_WHY_NOT))
    return found


def _made_by(snap: Snapshot, uuid: str) -> str:
    """Which call cut a temporary snapshot: its name carries the uuid of the entry it was for."""
    snapshot = snap.snap_journal.records.get(uuid)
    if snapshot is not None and snapshot.name:
        return f"a killed CreateSnapshot {snapshot.name!r} (its retry or DeleteSnapshot removes it too)"
    volume = snap.records.get(uuid)
    if volume is not None and volume.name:
        return f"a killed clone into volume {volume.name!r} (its retry removes it too)"
    # A clone placed in another topology pool than its source journals there: not gone, elsewhere.
    return "a killed snapshot or clone call whose journal entry is gone or in another pool"


def temp_snapshot_findings(snap: Snapshot) -> list[Finding]:
    by_image: dict[str, RecordView] = {r.image_name: r for r in snap.records.values() if r.name and r.image_name}
    found: list[Finding] = []
    for image_name, image_id in sorted(snap.directory.items()):
        snaps = snap.image_snaps.get(image_id)
        if snaps is None or not image_is_live(snap, image_name, image_id):
            continue
        record = by_image.get(image_name)
        if record is not None and f"{RECORD_PREFIXES[JournalType.VOLUME]}{record.uuid}" in snap.leases_held:
            continue  # a snapshot or clone of this volume is cutting right now
        for snap_name in snaps.names:
            if snap_name.startswith(TEMP_SNAP_PREFIX):
                found.append(_temp_snapshot(snap, image_name, image_id, snap_name, record))
    return found


def _temp_snapshot(snap: Snapshot, image_name: str, image_id: str, snap_name: str,
                   record: RecordView | None) -> Finding:
    detail = (f"temporary snapshot {snap_name!r} left by {_made_by(snap, snap_name[len(TEMP_SNAP_PREFIX):])}; "
              "the next snapshot or clone of this volume, or its deletion, removes it otherwise")
    subject = f"{image_name}@{snap_name}"
    if record is None:
        # The driver's rule (a temporary snapshot found under the source's lease is a dead
        # call's) holds only for a journaled volume: without a record there is no lease.
        return Finding(Kind.TEMP_SNAPSHOT, subject, detail, image_name=image_name, image_id=image_id,
                       ours=False, journal=None, rbd_snapshot=snap_name,
                       why_not="the image is no journaled volume here: no journal lease guards it")
    return Finding(Kind.TEMP_SNAPSHOT, subject, detail, uuid=record.uuid, name=record.name, image_name=image_name,
                   image_id=image_id, journal=JournalType.VOLUME, rbd_snapshot=snap_name, fix=Fix.REMOVE_TEMP_SNAP)


CONTENT_WHY_NOT = "a VolumeSnapshotContent is never repaired: deleting it is the CO's business"
WITHOUT_CONTENT_WHY_NOT = ("it may be a snapshot made outside Kubernetes; delete it through its VolumeSnapshot, "
                           "or with the driver's DeleteSnapshot")


def _content_state(content: ContentView) -> str:
    bound = f"VolumeSnapshot {content.volume_snapshot}" if content.volume_snapshot else "no VolumeSnapshot"
    return f"{bound}, deletionPolicy {content.deletion_policy or '?'}{', being deleted' if content.deleting else ''}"


def content_findings(snap: Snapshot) -> list[Finding]:
    """Only when the contents could be read; reported, never repaired."""
    if snap.contents is None:
        return []
    journal = snap.snap_journal
    found: list[Finding] = []
    for content in snap.contents:
        if not content.uuid:
            continue  # the snapshotter is still making its snapshot: no handle to compare yet
        record = journal.records.get(content.uuid)
        if record is None or not record.name:
            record = journal.split_records.get(content.uuid, record)
        if record is None or not record.name:
            found.append(Finding(Kind.CONTENT_SNAPSHOT_GONE, content.name, f"names snapshot {content.uuid}, which "
                                 f"the snapshot journal does not know ({_content_state(content)})",
                                 uuid=content.uuid, journal=JournalType.SNAPSHOT, why_not=CONTENT_WHY_NOT))
        elif not image_is_live(snap, record.image_name, image_id_of(snap, record)):
            found.append(Finding(Kind.CONTENT_SNAPSHOT_GONE, content.name, f"names snapshot image "
                                 f"{record.image_name!r}, which is not there ({_content_state(content)})",
                                 uuid=content.uuid, name=record.name, image_name=record.image_name,
                                 journal=JournalType.SNAPSHOT, why_not=CONTENT_WHY_NOT))
    for name, uuid in sorted(journal.name_keys.items()):
        record = journal.records.get(uuid)
        if record and record.name == name and not snap.contents_naming(uuid, name) and \
                image_is_live(snap, record.image_name, image_id_of(snap, record)):
            found.append(Finding(Kind.SNAPSHOT_WITHOUT_CONTENT, record.image_name, f"journaled for {name!r} but no "
                                 "VolumeSnapshotContent names it", uuid=uuid, name=name,
                                 image_name=record.image_name, journal=JournalType.SNAPSHOT,
                                 why_not=WITHOUT_CONTENT_WHY_NOT))
    return found


def content_blocks(snap: Snapshot, findings: list[Finding]) -> list[Finding]:
    """`findings` with the repair of every snapshot a VolumeSnapshotContent names taken away,
    as a PersistentVolume guards its volume: a repair would leave the content naming nothing,
    where a person may still restore the image (from the trash) or the record."""
    blocked: list[Finding] = []
    for finding in findings:
        names = snap.contents_naming(finding.uuid, finding.name) \
            if finding.journal is JournalType.SNAPSHOT and finding.fix is not None else ()
        blocked.append(replace(finding, fix=None, why_not=f"VolumeSnapshotContent {', '.join(names)} names it")
                       if names else finding)
    return blocked
