"""The snapshot journal's rules over hand-built snapshots: the volume rules applied to
`csi.snaps.*` → `csi.snap.*` → `csi-snap-*`, temporary snapshots left on source volumes, and
snapshot images without their restore point."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cephcsi.audit import scan_snaps
from cephcsi.audit.classify import classify
from cephcsi.audit.model import (
    Finding,
    Fix,
    ImageSnaps,
    JournalType,
    Kind,
    PurgeTask,
    PVView,
    RecordView,
    SnapJournalView,
    Snapshot,
    TrashView,
)
from cephcsi.audit.repair import ORDER
from cephcsi.ceph import omap
from cephcsi.ceph.imagestate import TrashState

pytestmark = pytest.mark.unit

U1 = "11111111-1111-4111-8111-111111111111"  # the source volume
S1 = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa"  # a healthy snapshot of it
S2 = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
VOL, SNAP1, SNAP2 = f"csi-vol-{U1}", f"csi-snap-{S1}", f"csi-snap-{S2}"
TEMP2 = f"cephcsi-tmp-{S2}"
NOW = 1_800_000_000.0


def healthy() -> Snapshot:
    """A volume and one finished snapshot of it (image with its restore point)."""
    return Snapshot(
        prefix="csi-vol-",
        name_keys={"pvc-1": U1},
        records={U1: RecordView(U1, "pvc-1", VOL, "vid")},
        directory={VOL: "vid", SNAP1: "sid1"},
        id_objects={VOL: "vid", SNAP1: "sid1"},
        headers=frozenset({"vid", "sid1"}),
        tasks={},
        now=NOW,
        snap_journal=SnapJournalView(
            name_keys={"snap-1": S1},
            records={S1: RecordView(S1, "snap-1", SNAP1, "sid1", source_image=VOL)},
        ),
        image_snaps={"vid": ImageSnaps(("uuid-of-trashed-cut",), has_children=True),
                     "sid1": ImageSnaps((SNAP1,))},
    )


def with_snapshot(snap: Snapshot, name: str, uuid: str, record: RecordView | None) -> Snapshot:
    journal = snap.snap_journal
    records = dict(journal.records)
    if record is not None:
        records[uuid] = record
    return replace(snap, snap_journal=replace(journal, name_keys={**journal.name_keys, name: uuid}, records=records))


def with_image(snap: Snapshot, name: str, image_id: str, header: bool = True) -> Snapshot:
    return replace(snap, directory={**snap.directory, name: image_id}, id_objects={**snap.id_objects, name: image_id},
                   headers=snap.headers | ({image_id} if header else set()))


def only(snap: Snapshot, kind: Kind) -> Finding:
    found = classify(snap)
    assert [f.kind for f in found] == [kind], found
    return found[0]


def test_a_healthy_snapshot_and_its_source_are_clean() -> None:
    assert classify(healthy()) == []
    # A restored volume reading through the snapshot image changes nothing.
    snap = replace(healthy(), image_snaps={**healthy().image_snaps, "sid1": ImageSnaps((SNAP1,), True)})
    assert classify(snap) == []


def test_a_snapshot_name_key_without_record_is_a_dead_create() -> None:
    # CreateSnapshot killed at snapshot.after-reserve.
    finding = only(with_snapshot(healthy(), "snap-2", S2, None), Kind.DANGLING_KEY)
    assert (finding.journal, finding.name, finding.uuid, finding.fix) == (JournalType.SNAPSHOT, "snap-2", S2,
                                                                          Fix.RELEASE_KEY)


def test_a_snapshot_record_whose_image_is_gone_dangles() -> None:
    # Killed at snapshot.after-record: the record names an image never cloned.
    snap = with_snapshot(healthy(), "snap-2", S2, RecordView(S2, "snap-2", SNAP2, source_image=VOL))
    finding = only(snap, Kind.DANGLING_RECORD)
    assert (finding.journal, finding.subject, finding.fix) == (JournalType.SNAPSHOT, "snap-2", Fix.REMOVE_RECORD)


def test_a_snapshot_record_whose_image_waits_in_the_trash_for_restored_volumes_is_a_delete_in_progress() -> None:
    # DeleteSnapshot killed at snapshot.delete.after-image with restored volumes: the image
    # waits in the trash for them, the record goes on the retry.
    snap = replace(healthy(), directory={VOL: "vid"}, id_objects={VOL: "vid"},
                   trash=(TrashView("sid1", SNAP1, TrashState.NORMAL, awaits_children=True, children_left=True),))
    assert classify(snap) == []


def test_snapshot_records_no_key_names_are_orphans() -> None:
    journal = healthy().snap_journal
    gone = replace(healthy(), snap_journal=replace(journal, records={
        **journal.records, S2: RecordView(S2, "snap-2", SNAP2), U1[:-1] + "9": RecordView(U1[:-1] + "9", "")}))
    found = classify(gone)
    assert {(f.kind, f.subject, f.journal, f.fix) for f in found} == {
        (Kind.ORPHAN_RECORD, f"csi.snap.{S2}", JournalType.SNAPSHOT, Fix.REMOVE_RECORD),
        (Kind.ORPHAN_RECORD, f"csi.snap.{U1[:-1]}9", JournalType.SNAPSHOT, Fix.REMOVE_RECORD)}
    live = replace(healthy(), snap_journal=replace(journal, name_keys={}))
    finding = only(live, Kind.ORPHAN_RECORD)
    assert finding.fix is None and "live" in finding.why_not


def test_other_instances_snapshots_are_not_judged() -> None:
    journal = healthy().snap_journal
    snap = replace(healthy(), snap_journal=replace(journal, name_keys={}, foreign_uuids=frozenset({S1})))
    assert classify(snap) == []


def test_a_snapshot_image_no_record_names_is_an_orphan_repaired_only_by_the_volume_rules() -> None:
    snap = replace(with_image(healthy(), SNAP2, "sid2"), image_snaps={**healthy().image_snaps,
                                                                      "sid2": ImageSnaps((SNAP2,))})
    finding = only(snap, Kind.ORPHAN_IMAGE)
    assert (finding.journal, finding.uuid, finding.fix) == (JournalType.SNAPSHOT, S2, None)
    assert "kubeconfig" in finding.why_not
    with_pvs = replace(snap, pvs=(PVView("pv-1", U1, VOL),))
    assert only(with_pvs, Kind.ORPHAN_IMAGE).fix is Fix.TRASH_ORPHAN  # still only with --repair-orphan-images


def test_an_orphan_snapshot_image_that_restored_volumes_read_through_is_never_moved() -> None:
    snap = replace(with_image(healthy(), SNAP2, "sid2"), pvs=(PVView("pv-1", U1, VOL),),
                   image_snaps={**healthy().image_snaps, "sid2": ImageSnaps((SNAP2,), has_children=True)})
    finding = only(snap, Kind.ORPHAN_IMAGE)
    assert finding.fix is None and "read through" in finding.why_not


def test_images_not_named_like_snapshots_are_not_snapshot_orphans() -> None:
    snap = with_image(healthy(), "csi-snap-notauuid", "x1")
    assert classify(snap) == []
    custom = with_image(healthy(), f"team-snap-{S2}", "sid2")
    assert classify(custom) == []
    assert only(replace(custom, snap_journal=replace(custom.snap_journal, prefix="team-snap-")),
                Kind.ORPHAN_IMAGE).uuid == S2


def test_a_snapshot_images_partial_create_is_repaired_under_the_snapshot_lease() -> None:
    # A clone killed inside librbd before the header, its journal entry intact.
    snap = with_image(with_snapshot(healthy(), "snap-2", S2, RecordView(S2, "snap-2", SNAP2, source_image=VOL)),
                      SNAP2, "sid2", header=False)
    found = {f.kind: f for f in classify(snap)}
    assert set(found) == {Kind.PARTIAL_CREATE, Kind.DANGLING_RECORD}
    partial = found[Kind.PARTIAL_CREATE]
    assert (partial.journal, partial.uuid, partial.fix, partial.ours) == (JournalType.SNAPSHOT, S2,
                                                                          Fix.REMOVE_PARTIAL, True)


def trashed(state: TrashState, task: PurgeTask | None = None, **extra: bool) -> Snapshot:
    entry = TrashView("sid2", SNAP2, state, **extra)
    return replace(healthy(), trash=(entry,), tasks={"sid2": task} if task else {})


def test_trash_entries_of_snapshot_images_follow_the_volume_trash_rules() -> None:
    moving = only(trashed(TrashState.MOVING), Kind.TRASH_MOVING)
    assert (moving.journal, moving.uuid, moving.fix) == (JournalType.SNAPSHOT, S2, Fix.FINISH_MOVE)
    assert only(trashed(TrashState.REMOVING), Kind.TRASH_REMOVING).fix is Fix.PURGE
    assert only(trashed(TrashState.NORMAL), Kind.TRASH_UNQUEUED).fix is Fix.PURGE
    assert classify(trashed(TrashState.NORMAL, PurgeTask("sid2"))) == []  # a DeleteSnapshot's queued purge
    # A deleted snapshot whose restored volumes still read through it: librbd purges it after them.
    assert classify(trashed(TrashState.NORMAL, awaits_children=True, children_left=True)) == []
    abandoned = only(trashed(TrashState.NORMAL, awaits_children=True, children_left=False), Kind.TRASH_UNQUEUED)
    assert abandoned.journal is JournalType.SNAPSHOT and abandoned.fix is Fix.PURGE


def test_a_trash_entry_is_a_snapshots_by_its_journaled_id() -> None:
    snap = with_snapshot(healthy(), "snap-2", S2, RecordView(S2, "snap-2", "renamed", "sid2"))
    snap = replace(snap, trash=(TrashView("sid2", "renamed", TrashState.MOVING),))
    finding = only(snap, Kind.TRASH_MOVING)
    assert (finding.journal, finding.uuid) == (JournalType.SNAPSHOT, S2)


def test_a_temporary_snapshot_on_a_journaled_volume_is_removed_under_its_lease() -> None:
    # CreateSnapshot killed at snapshot.after-source-snap: its record (image never cloned)
    # dangles, and the temporary snapshot sits on the source.
    snap = with_snapshot(healthy(), "snap-2", S2, RecordView(S2, "snap-2", SNAP2, source_image=VOL))
    snap = replace(snap, image_snaps={**snap.image_snaps, "vid": ImageSnaps((TEMP2,))})
    found = {f.kind: f for f in classify(snap)}
    assert set(found) == {Kind.TEMP_SNAPSHOT, Kind.DANGLING_RECORD}
    temp = found[Kind.TEMP_SNAPSHOT]
    assert (temp.subject, temp.journal, temp.uuid, temp.rbd_snapshot, temp.fix) == (
        f"{VOL}@{TEMP2}", JournalType.VOLUME, U1, TEMP2, Fix.REMOVE_TEMP_SNAP)
    assert "CreateSnapshot 'snap-2'" in temp.detail and "next snapshot or clone" in temp.detail
    # Repaired before the record, while the record still says which call left it.
    assert ORDER.index(Fix.REMOVE_TEMP_SNAP) < ORDER.index(Fix.REMOVE_RECORD)


def test_a_temporary_snapshot_is_not_debris_while_a_call_holds_the_source_lease() -> None:
    snap = replace(healthy(), image_snaps={**healthy().image_snaps, "vid": ImageSnaps((TEMP2,))})
    assert only(snap, Kind.TEMP_SNAPSHOT).fix is Fix.REMOVE_TEMP_SNAP
    assert "journal entry is gone" in only(snap, Kind.TEMP_SNAPSHOT).detail
    assert classify(replace(snap, leases_held=frozenset({f"csi.volume.{U1}"}))) == []


def test_a_temporary_snapshot_of_a_clone_names_the_clone() -> None:
    clone = "cccccccc-cccc-4ccc-8ccc-cccccccccccc"
    snap = replace(healthy(), name_keys={"pvc-1": U1, "pvc-clone": clone},
                   records={**healthy().records, clone: RecordView(clone, "pvc-clone", f"csi-vol-{clone}")},
                   image_snaps={**healthy().image_snaps, "vid": ImageSnaps((f"cephcsi-tmp-{clone}",))})
    found = {f.kind: f for f in classify(snap)}
    assert set(found) == {Kind.TEMP_SNAPSHOT, Kind.DANGLING_RECORD}
    assert "clone into volume 'pvc-clone'" in found[Kind.TEMP_SNAPSHOT].detail
    assert found[Kind.DANGLING_RECORD].journal is JournalType.VOLUME


def test_a_temporary_snapshot_on_an_image_no_journal_names_is_reported_only() -> None:
    snap = replace(with_image(healthy(), "someone-elses", "xid"),
                   image_snaps={**healthy().image_snaps, "xid": ImageSnaps((TEMP2, "daily"))})
    finding = only(snap, Kind.TEMP_SNAPSHOT)
    assert finding.fix is None and not finding.ours and finding.journal is None


def test_a_snapshot_image_without_its_restore_point_is_unfinished_and_reported_only() -> None:
    # Killed at snapshot.after-clone: the clone exists, the restore point does not.
    snap = with_image(with_snapshot(healthy(), "snap-2", S2, RecordView(S2, "snap-2", SNAP2, source_image=VOL)),
                      SNAP2, "sid2")
    finding = only(snap, Kind.UNFINISHED_SNAPSHOT)
    assert (finding.journal, finding.name, finding.fix) == (JournalType.SNAPSHOT, "snap-2", None)
    assert "retry" in finding.why_not
    assert classify(replace(snap, leases_held=frozenset({f"csi.snap.{S2}"}))) == []  # being cut right now
    done = replace(snap, image_snaps={**snap.image_snaps, "sid2": ImageSnaps((SNAP2,))})
    assert classify(done) == []


def test_header_snapshot_names_and_lease_replies_are_decoded() -> None:
    # Bytes librbd and cls_lock wrote on Ceph 16 (see tests/integration/audit).
    temp = bytes.fromhex("08084300000004000000000000000f000000636570686373692d746d702d61626300004000000000")
    keep = bytes.fromhex("0808380000000500000000000000040000006b656570000040000000000000000000000000000001")
    snaps = scan_snaps.image_snaps_from_omap({"snapshot_0000000000000004": temp, "snapshot_0000000000000005": keep,
                                              "snap_seq": b"\x05" + bytes(7)})
    assert snaps == ImageSnaps(("cephcsi-tmp-abc", "keep"), False)
    assert scan_snaps.image_snaps_from_omap({"snap_children_0000000000000004": b"\x01"}).has_children
    assert not omap.lock_is_held(bytes.fromhex("010109000000000000000100000000"))
    assert omap.lock_is_held(bytes.fromhex("0101530000000100000001010f000000082a10"))
    assert scan_snaps.lease_candidates(healthy().records, healthy().snap_journal, healthy().directory,
                                       {"vid": ImageSnaps((TEMP2,)), "sid1": ImageSnaps(())}) == [
        f"csi.volume.{U1}", f"csi.snap.{S1}"]
