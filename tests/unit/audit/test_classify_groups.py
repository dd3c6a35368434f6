"""The group journal's rules over hand-built snapshots: a group snapshot whose create never
finished, an RBD group no record names, and member snapshots of a group that is gone."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cephcsi.audit.classify import classify
from cephcsi.audit.classify_groups import member_group_name
from cephcsi.audit.model import (
    Fix,
    GroupJournalView,
    GroupRecordView,
    ImageSnaps,
    JournalType,
    Kind,
    RecordView,
    SnapJournalView,
    Snapshot,
)
from cephcsi.audit.repair import ACTIONS, ORDER
from cephcsi.audit.scan_groups import group_lease_candidates

pytestmark = pytest.mark.unit

G = "99999999-9999-4999-8999-999999999999"  # the group snapshot
U1, U2 = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
M1, M2 = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
VOL1, VOL2 = f"csi-vol-{U1}", f"csi-vol-{U2}"
SNAP1, SNAP2 = f"csi-snap-{M1}", f"csi-snap-{M2}"
GROUP = f"csi-vol-group-{G}"
NAME = "groupsnapshot-1"


def finished() -> Snapshot:
    """Two volumes and a finished group snapshot of them: members done, RBD group removed."""
    return Snapshot(
        prefix="csi-vol-",
        name_keys={"pvc-1": U1, "pvc-2": U2},
        records={U1: RecordView(U1, "pvc-1", VOL1, "v1"), U2: RecordView(U2, "pvc-2", VOL2, "v2")},
        directory={VOL1: "v1", VOL2: "v2", SNAP1: "s1", SNAP2: "s2"},
        id_objects={VOL1: "v1", VOL2: "v2", SNAP1: "s1", SNAP2: "s2"},
        headers=frozenset({"v1", "v2", "s1", "s2"}),
        tasks={},
        snap_journal=SnapJournalView(
            name_keys={f"{NAME}-{M1}": M1, f"{NAME}-{M2}": M2},
            records={M1: RecordView(M1, f"{NAME}-{M1}", SNAP1, "s1", source_image=VOL1),
                     M2: RecordView(M2, f"{NAME}-{M2}", SNAP2, "s2", source_image=VOL2)}),
        groups=GroupJournalView(
            name_keys={NAME: G},
            records={G: GroupRecordView(G, NAME, GROUP, (("id-of-m1", SNAP1), ("id-of-m2", SNAP2)))},
            rbd_groups={}),
        image_snaps={"s1": ImageSnaps((SNAP1,)), "s2": ImageSnaps((SNAP2,))},
    )


def kinds(snap: Snapshot) -> list[tuple[Kind, str, JournalType | None, Fix | None]]:
    return [(f.kind, f.subject, f.journal, f.fix) for f in classify(snap)]


def with_groups(snap: Snapshot, **changes: object) -> Snapshot:
    return replace(snap, groups=replace(snap.groups, **changes))  # type: ignore[arg-type]


def test_a_finished_group_snapshot_is_clean() -> None:
    assert classify(finished()) == []


def test_a_create_killed_with_its_rbd_group_holding_the_sources_is_reported_with_them() -> None:
    snap = with_groups(finished(), rbd_groups={GROUP: (VOL1, VOL2)})
    [finding] = classify(snap)
    assert (finding.kind, finding.subject, finding.journal, finding.fix) == \
        (Kind.UNFINISHED_GROUP, NAME, JournalType.GROUP, None)
    assert f"still holds source image(s) {VOL1}, {VOL2}" in finding.detail
    assert "retry" in finding.why_not


def test_unfinished_members_are_reported_even_after_the_rbd_group_is_gone() -> None:
    # Member 2's record only (killed after group.after-members): no image yet.
    snap = finished()
    snap = replace(snap, directory={k: v for k, v in snap.directory.items() if k != SNAP2},
                   id_objects={k: v for k, v in snap.id_objects.items() if k != SNAP2},
                   headers=snap.headers - {"s2"},
                   snap_journal=replace(snap.snap_journal, records={
                       **snap.snap_journal.records, M2: RecordView(M2, f"{NAME}-{M2}", SNAP2, source_image=VOL2)}))
    dangling, finding = classify(snap)
    # The member's record reads as dangling, but only the group's retry or delete settles it.
    assert (dangling.kind, dangling.subject, dangling.fix) == (Kind.DANGLING_RECORD, f"{NAME}-{M2}", None)
    assert f"group snapshot {NAME!r}" in dangling.why_not
    assert finding.kind is Kind.UNFINISHED_GROUP
    assert f"1 of 2 member snapshot(s) unfinished ({SNAP2})" in finding.detail
    # A copy without its restore point is unfinished too (and the snapshot rule reports it).
    copied = replace(finished(), image_snaps={"s1": ImageSnaps((SNAP1,)), "s2": ImageSnaps(())})
    assert {k for k, *_ in kinds(copied)} == {Kind.UNFINISHED_GROUP, Kind.UNFINISHED_SNAPSHOT}


def test_a_create_in_flight_holds_the_group_lease_and_is_not_judged() -> None:
    snap = replace(with_groups(finished(), rbd_groups={GROUP: (VOL1,)}),
                   leases_held=frozenset({f"csi.volume.group.{G}"}))
    assert classify(snap) == []


def test_a_dangling_snapshot_record_of_no_group_is_still_repaired() -> None:
    snap = with_groups(finished(), records={}, name_keys={})
    gone = replace(snap, directory={VOL1: "v1", VOL2: "v2"}, id_objects={VOL1: "v1", VOL2: "v2"},
                   headers=frozenset({"v1", "v2"}),
                   snap_journal=replace(snap.snap_journal, records={M1: RecordView(M1, "snap-x", SNAP1)},
                                        name_keys={"snap-x": M1}))
    assert kinds(gone) == [(Kind.DANGLING_RECORD, "snap-x", JournalType.SNAPSHOT, Fix.REMOVE_RECORD)]


def test_a_record_left_without_its_name_key_says_so() -> None:
    snap = with_groups(finished(), name_keys={}, rbd_groups={GROUP: ()})
    [finding] = classify(snap)
    assert finding.kind is Kind.UNFINISHED_GROUP and "no name key points at the record" in finding.detail


def test_an_rbd_group_without_a_record_is_removed_by_repair() -> None:
    other = "77777777-7777-4777-8777-777777777777"
    snap = with_groups(finished(), rbd_groups={f"csi-vol-group-{other}": (VOL1,), "someone-elses": (VOL2,)})
    assert kinds(snap) == [(Kind.ORPHAN_RBD_GROUP, f"csi-vol-group-{other}", JournalType.GROUP, Fix.REMOVE_RBD_GROUP)]
    [finding] = classify(snap)
    assert finding.uuid == other and "leaves every image as it is" in finding.detail
    assert Fix.REMOVE_RBD_GROUP in ORDER and Fix.REMOVE_RBD_GROUP in ACTIONS
    busy = replace(snap, leases_held=frozenset({f"csi.volume.group.{other}"}))
    assert kinds(busy) == [(Kind.ORPHAN_RBD_GROUP, f"csi-vol-group-{other}", JournalType.GROUP, None)]


def test_a_group_named_by_a_record_with_a_custom_prefix_is_no_orphan() -> None:
    custom = "mygroups-x"
    snap = with_groups(finished(), records={G: GroupRecordView(G, NAME, custom, (("id-of-m1", SNAP1),
                                                                                  ("id-of-m2", SNAP2)))},
                       rbd_groups={custom: (VOL1,)})
    assert [k for k, *_ in kinds(snap)] == [Kind.UNFINISHED_GROUP]


def test_members_of_a_group_the_journal_does_not_know_are_reported_only() -> None:
    snap = with_groups(finished(), name_keys={}, records={})
    assert kinds(snap) == [(Kind.ORPHAN_GROUP_MEMBER, f"{NAME}-{M1}", JournalType.SNAPSHOT, None),
                           (Kind.ORPHAN_GROUP_MEMBER, f"{NAME}-{M2}", JournalType.SNAPSHOT, None)]
    # An ordinary snapshot's name never reads as a member's.
    assert member_group_name(f"snapshot-{M2}", M1) == ""
    assert member_group_name(f"{NAME}-{M1}", M1) == NAME
    assert member_group_name(f"-{M1}", M1) == ""


def test_without_a_group_listing_no_rbd_group_is_judged() -> None:
    snap = with_groups(finished(), rbd_groups=None)
    assert classify(snap) == []


def test_lease_candidates_are_every_named_record_and_every_group_named_like_ours() -> None:
    other = "77777777-7777-4777-8777-777777777777"
    view = replace(finished().groups, rbd_groups={f"csi-vol-group-{other}": (), "x": ()},
                   records={G: GroupRecordView(G, NAME, GROUP), other: GroupRecordView(other, "")})
    assert group_lease_candidates(view) == sorted([f"csi.volume.group.{G}", f"csi.volume.group.{other}"])


def test_a_group_key_without_its_record_is_released_and_an_empty_record_removed() -> None:
    lost, empty = "55555555-5555-4555-8555-555555555555", "66666666-6666-4666-8666-666666666666"
    snap = with_groups(finished(), name_keys={NAME: G, "groupsnapshot-lost": lost},
                       records={**finished().groups.records, empty: GroupRecordView(empty, "")})
    assert kinds(snap) == [(Kind.DANGLING_KEY, "groupsnapshot-lost", JournalType.GROUP, Fix.RELEASE_KEY),
                           (Kind.ORPHAN_RECORD, f"csi.volume.group.{empty}", JournalType.GROUP, Fix.REMOVE_RECORD)]
