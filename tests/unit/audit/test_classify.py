"""The audit's rules, one inconsistency at a time, over hand-built snapshots."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cephcsi.audit.classify import classify
from cephcsi.audit.model import Finding, Fix, Kind, PurgeTask, PVView, RecordView, Snapshot, TrashView
from cephcsi.ceph.imagestate import TrashState

pytestmark = pytest.mark.unit

U1 = "11111111-1111-4111-8111-111111111111"
U2 = "22222222-2222-4222-8222-222222222222"
U3 = "33333333-3333-4333-8333-333333333333"
IMG1, IMG2, IMG3 = f"csi-vol-{U1}", f"csi-vol-{U2}", f"csi-vol-{U3}"
NOW = 1_800_000_000.0


def healthy() -> Snapshot:
    """One complete volume: key → record → live image, a PV naming it, nothing else."""
    return Snapshot(
        prefix="csi-vol-",
        name_keys={"pvc-1": U1},
        records={U1: RecordView(U1, "pvc-1", IMG1, "id1")},
        directory={IMG1: "id1"},
        id_objects={IMG1: "id1"},
        headers=frozenset({"id1"}),
        tasks={},
        now=NOW,
    )


def kinds(snap: Snapshot) -> list[Kind]:
    return [f.kind for f in classify(snap)]


def only(snap: Snapshot, kind: Kind) -> Finding:
    found = classify(snap)
    assert [f.kind for f in found] == [kind], found
    return found[0]


def test_a_healthy_pool_is_clean() -> None:
    assert classify(healthy()) == []
    assert classify(replace(healthy(), pvs=(PVView("pv-1", U1, IMG1, "Bound"),))) == []


def test_an_image_with_no_record_is_an_orphan_reported_only_without_kubeconfig() -> None:
    snap = replace(healthy(), directory={IMG1: "id1", IMG2: "id2"}, id_objects={IMG1: "id1", IMG2: "id2"},
                   headers=frozenset({"id1", "id2"}))
    finding = only(snap, Kind.ORPHAN_IMAGE)
    assert (finding.subject, finding.uuid, finding.image_id, finding.fix) == (IMG2, U2, "id2", None)
    assert "kubeconfig" in finding.why_not


def test_an_orphan_image_is_movable_only_when_no_pv_names_it() -> None:
    snap = replace(healthy(), directory={IMG1: "id1", IMG2: "id2"}, id_objects={IMG1: "id1", IMG2: "id2"},
                   headers=frozenset({"id1", "id2"}), pvs=(PVView("pv-1", U1, IMG1),))
    assert only(snap, Kind.ORPHAN_IMAGE).fix is Fix.TRASH_ORPHAN
    by_handle = replace(snap, pvs=(PVView("pv-1", U1, IMG1), PVView("pv-2", U2)))
    by_attribute = replace(snap, pvs=(PVView("pv-1", U1, IMG1), PVView("static", "", IMG2)))
    for blocked in (by_handle, by_attribute):
        finding = next(f for f in classify(blocked) if f.kind is Kind.ORPHAN_IMAGE)
        assert finding.fix is None and "PersistentVolume" in finding.why_not


def test_images_not_named_like_ours_are_not_orphans() -> None:
    snap = replace(healthy(), directory={IMG1: "id1", "db-backup": "id9", "csi-vol-notauuid": "id8"},
                   id_objects={IMG1: "id1", "db-backup": "id9", "csi-vol-notauuid": "id8"},
                   headers=frozenset({"id1", "id9", "id8"}))
    assert classify(snap) == []
    # The prefix decides what is ours.
    team = replace(snap, directory={**snap.directory, f"team-a-{U2}": "id2"},
                   id_objects={**snap.id_objects, f"team-a-{U2}": "id2"}, headers=snap.headers | {"id2"})
    assert classify(team) == []
    assert only(replace(team, prefix="team-a-"), Kind.ORPHAN_IMAGE).uuid == U2


def test_a_record_whose_image_is_gone_dangles() -> None:
    snap = replace(healthy(), directory={}, id_objects={}, headers=frozenset())
    finding = only(snap, Kind.DANGLING_RECORD)
    assert (finding.subject, finding.uuid, finding.fix) == ("pvc-1", U1, Fix.REMOVE_RECORD)


def test_a_record_whose_image_is_in_the_trash_does_not_dangle() -> None:
    snap = replace(healthy(), directory={}, id_objects={}, trash=(TrashView("id1", IMG1, TrashState.NORMAL),),
                   tasks={"id1": PurgeTask("id1")})
    assert classify(snap) == []  # a delete in progress: the mgr purges, the record goes last


def test_a_dangling_record_named_by_a_pv_is_not_removed() -> None:
    snap = replace(healthy(), directory={}, id_objects={}, headers=frozenset(),
                   pvs=(PVView("pv-1", U1, IMG1, "Bound"),))
    by_kind = {f.kind: f for f in classify(snap)}
    assert set(by_kind) == {Kind.DANGLING_RECORD, Kind.PV_IMAGE_GONE}
    assert by_kind[Kind.DANGLING_RECORD].fix is None


PENDING = (("csi.storage.k8s.io/pvc/name", "data"),)


def test_a_live_volume_whose_record_keeps_metadata_is_repaired_by_copying_it() -> None:
    snap = replace(healthy(), records={U1: RecordView(U1, "pvc-1", IMG1, "id1", pending_metadata=PENDING)})
    finding = only(snap, Kind.METADATA_PENDING)
    assert (finding.subject, finding.uuid, finding.fix) == (IMG1, U1, Fix.COPY_METADATA)
    assert "csi.storage.k8s.io/pvc/name" in finding.detail


def test_pending_metadata_is_no_finding_while_a_call_holds_the_lease_or_without_a_live_image() -> None:
    snap = replace(healthy(), records={U1: RecordView(U1, "pvc-1", IMG1, "id1", pending_metadata=PENDING)})
    assert classify(replace(snap, leases_held=frozenset({f"csi.volume.{U1}"}))) == []  # the create writes it
    gone = replace(snap, directory={}, id_objects={}, headers=frozenset())
    assert kinds(gone) == [Kind.DANGLING_RECORD]  # nothing to copy to; the record's own finding


def test_a_key_without_record_dangles() -> None:
    for records in ({}, {U1: RecordView(U1, "")}):  # missing, or only a lock's empty object
        snap = replace(healthy(), records=records, directory={}, id_objects={}, headers=frozenset())
        finding = only(snap, Kind.DANGLING_KEY)
        assert (finding.name, finding.uuid, finding.fix) == ("pvc-1", U1, Fix.RELEASE_KEY)


def test_records_no_key_points_at_are_orphans() -> None:
    gone = replace(healthy(), name_keys={}, directory={}, id_objects={}, headers=frozenset())
    assert only(gone, Kind.ORPHAN_RECORD).fix is Fix.REMOVE_RECORD
    empty = replace(gone, records={U1: RecordView(U1, "")})
    assert only(empty, Kind.ORPHAN_RECORD).fix is Fix.REMOVE_RECORD
    live = replace(healthy(), name_keys={})
    finding = only(live, Kind.ORPHAN_RECORD)
    assert finding.fix is None and "live" in finding.why_not


def test_records_of_other_instances_are_not_judged() -> None:
    snap = replace(healthy(), name_keys={}, foreign_uuids=frozenset({U1}))
    assert classify(snap) == []


def test_a_key_pointing_at_someone_elses_record_is_a_mismatch() -> None:
    snap = replace(healthy(), name_keys={"pvc-1": U1, "pvc-2": U1})
    finding = only(snap, Kind.NAME_MISMATCH)
    assert finding.name == "pvc-2" and finding.fix is None


@pytest.mark.parametrize("dir_entry, id_object", [(True, False), (True, True), (False, True)])
def test_names_without_a_header_are_partial_creates(dir_entry: bool, id_object: bool) -> None:
    snap = replace(healthy(), directory={IMG1: "id1", **({IMG2: "id2"} if dir_entry else {})},
                   id_objects={IMG1: "id1", **({IMG2: "id2"} if id_object else {})},
                   name_keys={"pvc-1": U1, "pvc-2": U2}, records={**healthy().records,
                                                                  U2: RecordView(U2, "pvc-2", IMG2)})
    found = {f.kind: f for f in classify(snap)}
    assert found[Kind.PARTIAL_CREATE].fix is Fix.REMOVE_PARTIAL
    assert found[Kind.PARTIAL_CREATE].uuid == U2
    assert Kind.DANGLING_RECORD in found  # its record is repaired after the debris is gone


def test_partial_creates_not_named_like_ours_are_reported_not_repaired() -> None:
    snap = replace(healthy(), directory={IMG1: "id1", "other": "id7"})
    finding = only(snap, Kind.PARTIAL_CREATE)
    assert finding.fix is None and not finding.ours


def test_a_header_nothing_leads_to_is_stray() -> None:
    snap = replace(healthy(), headers=frozenset({"id1", "id5"}))
    finding = only(snap, Kind.STRAY_HEADER)
    assert finding.fix is None and finding.image_id == "id5"


def trashed(state: TrashState, task: PurgeTask | None = None, deferred: float = 0.0,
            name: str = IMG2) -> Snapshot:
    return replace(healthy(), trash=(TrashView("id2", name, state, deferred),),
                   tasks={"id2": task} if task else {})


def test_a_half_moved_trash_entry_is_always_a_finding() -> None:
    for task in (None, PurgeTask("id2", 3, "[errno 117] error deleting image from trash")):
        finding = only(trashed(TrashState.MOVING, task), Kind.TRASH_MOVING)
        assert finding.fix is Fix.FINISH_MOVE and finding.uuid == U2


def test_a_removing_entry_is_a_finding_unless_the_mgr_is_on_it() -> None:
    assert only(trashed(TrashState.REMOVING), Kind.TRASH_REMOVING).fix is Fix.PURGE
    failing = only(trashed(TrashState.REMOVING, PurgeTask("id2", 2, "[errno 16] busy")), Kind.TRASH_REMOVING)
    assert "errno 16" in failing.detail
    assert classify(trashed(TrashState.REMOVING, PurgeTask("id2"))) == []


def test_normal_trash_entries() -> None:
    assert classify(trashed(TrashState.NORMAL, PurgeTask("id2"))) == []  # queued: a delete in progress
    assert only(trashed(TrashState.NORMAL), Kind.TRASH_UNQUEUED).fix is Fix.PURGE
    assert classify(trashed(TrashState.NORMAL, deferred=NOW + 60)) == []  # deferred on purpose
    assert only(trashed(TrashState.NORMAL, deferred=NOW - 60), Kind.TRASH_UNQUEUED)
    stuck = only(trashed(TrashState.NORMAL, PurgeTask("id2", 5, "[errno 39] has snapshots")), Kind.TRASH_UNPURGEABLE)
    assert stuck.fix is None and "errno 39" in stuck.detail
    assert classify(trashed(TrashState.NORMAL, name="someone-elses")) == []


def test_a_deleted_clone_parent_is_a_finding_only_once_its_clones_are_gone() -> None:
    def parent(children_left: bool, name: str = IMG2) -> Snapshot:
        snap = trashed(TrashState.NORMAL, name=name)
        entry = replace(snap.trash[0], awaits_children=True, children_left=children_left)
        return replace(snap, trash=(entry,))

    assert classify(parent(children_left=True)) == []  # librbd purges it after its last clone
    abandoned = only(parent(children_left=False), Kind.TRASH_UNQUEUED)
    assert abandoned.fix is Fix.PURGE and "clones are all gone" in abandoned.detail
    foreign = only(parent(children_left=False, name="csi-snap-x"), Kind.TRASH_UNQUEUED)
    assert foreign.fix is None  # reported, but not this journal's image to purge


def test_trash_entries_are_ours_by_name_or_by_a_journaled_id() -> None:
    snap = replace(trashed(TrashState.MOVING, name="renamed"),
                   records={**healthy().records, U2: RecordView(U2, "pvc-2", "renamed", "id2")},
                   name_keys={"pvc-1": U1, "pvc-2": U2})
    finding = only(snap, Kind.TRASH_MOVING)
    assert finding.uuid == U2 and finding.fix is Fix.FINISH_MOVE
    foreign = only(trashed(TrashState.MOVING, name="renamed"), Kind.TRASH_MOVING)
    assert foreign.fix is None and not foreign.ours


def test_without_the_task_list_normal_entries_are_not_judged() -> None:
    snap = replace(trashed(TrashState.NORMAL), tasks=None)
    assert classify(snap) == []
    assert kinds(replace(trashed(TrashState.MOVING), tasks=None)) == [Kind.TRASH_MOVING]


def test_pv_whose_image_is_gone_and_image_whose_pv_is_gone() -> None:
    snap = replace(healthy(), pvs=(PVView("pv-x", U3, "", "Bound"),))
    found = {f.kind: f for f in classify(snap)}
    assert set(found) == {Kind.PV_IMAGE_GONE, Kind.IMAGE_WITHOUT_PV}
    assert found[Kind.PV_IMAGE_GONE].subject == "pv-x" and found[Kind.PV_IMAGE_GONE].fix is None
    assert found[Kind.IMAGE_WITHOUT_PV].subject == IMG1 and found[Kind.IMAGE_WITHOUT_PV].fix is None


def test_static_pvs_only_protect_images() -> None:
    snap = replace(healthy(), pvs=(PVView("pv-1", U1, IMG1), PVView("static", "", "some-image")))
    assert classify(snap) == []


# ---- ceph-csi volumes journaled in another pool than their image (split_journal) ----------


def test_a_name_key_into_another_pool_with_its_record_and_live_image_is_clean() -> None:
    from cephcsi.audit.model import RemoteKeyView

    # The journal pool's view: the key holds <pool id>/<uuid>, the record is here (ceph-csi's code).
    snap = replace(healthy(), records={**healthy().records,
                                       U2: RecordView(U2, "pvc-2", IMG2, "id2", "0000000000000001")},
                   remote_keys={"pvc-2": RemoteKeyView("pvc-2", U2, "topo", "rbd", IMG2, "live")})
    assert classify(snap) == []
    assert classify(replace(snap, remote_keys={"pvc-2": RemoteKeyView("pvc-2", U2, "topo", "rbd", IMG2,
                                                                      "trash")})) == []


def test_a_split_volume_whose_image_is_gone_is_reported_never_repaired() -> None:
    from cephcsi.audit.model import RemoteKeyView

    snap = replace(healthy(), records={**healthy().records,
                                       U2: RecordView(U2, "pvc-2", IMG2, "id2", "0000000000000001")},
                   remote_keys={"pvc-2": RemoteKeyView("pvc-2", U2, "topo", "rbd", IMG2, "gone")})
    finding = only(snap, Kind.DANGLING_RECORD)
    assert finding.fix is None and "another pool" in finding.why_not


@pytest.mark.parametrize("image_pool", ["topo", ""], ids=["no-record", "pool-gone"])
def test_a_split_name_key_with_nothing_behind_it_is_released(image_pool: str) -> None:
    from cephcsi.audit.model import RemoteKeyView

    snap = replace(healthy(), remote_keys={"pvc-2": RemoteKeyView("pvc-2", U2, image_pool)})
    finding = only(snap, Kind.DANGLING_KEY)
    assert (finding.fix, finding.name, finding.uuid) == (Fix.RELEASE_SPLIT_KEY, "pvc-2", U2)
    assert (image_pool or "no longer exists") in finding.detail


def test_the_image_pools_empty_object_and_image_of_a_split_volume_are_not_debris() -> None:
    # The image pool's view: an empty csi.volume.<uuid> (ceph-csi reserves the uuid with it) and
    # the image; the named record is in the journal pool (split_records).
    snap = replace(healthy(), records={**healthy().records, U2: RecordView(U2, "")},
                   directory={IMG1: "id1", IMG2: "id2"}, id_objects={IMG1: "id1", IMG2: "id2"},
                   headers=frozenset({"id1", "id2"}),
                   split_records={U2: RecordView(U2, "pvc-2", IMG2, "id2", "0000000000000001")},
                   pvs=(PVView("pv-1", U1, IMG1), PVView("pv-2", U2, IMG2)))
    assert classify(snap) == []
    # Without the record elsewhere the same objects are what they look like.
    assert sorted(kinds(replace(snap, split_records={}))) == [Kind.ORPHAN_IMAGE, Kind.ORPHAN_RECORD,
                                                              Kind.PV_IMAGE_GONE]


def test_records_carrying_csi_journalpool_are_never_repaired() -> None:
    snap = replace(healthy(), records={**healthy().records,
                                       U2: RecordView(U2, "pvc-2", IMG2, "id2", "0000000000000005")})
    finding = only(snap, Kind.ORPHAN_RECORD)
    assert finding.fix is None and "another pool" in finding.why_not
    named = replace(snap, split_named=frozenset({U2}))
    finding = only(named, Kind.DANGLING_RECORD)  # its image (here) is gone
    assert finding.fix is None


def test_a_malformed_name_key_is_reported_only() -> None:
    finding = only(replace(healthy(), malformed_keys={"pvc-9": "garbage"}), Kind.DANGLING_KEY)
    assert finding.fix is None and "garbage" in finding.detail
