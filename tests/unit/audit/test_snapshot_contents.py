"""VolumeSnapshotContents in the audit: which contents count (driver, cluster, pool, handle or
request name), the two findings they bring (a content whose snapshot is gone, a snapshot no
content names), the repairs they block, and how the report says whether they were read."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from cephcsi.audit import report, run
from cephcsi.audit.classify import classify
from cephcsi.audit.kube_lists import list_all
from cephcsi.audit.model import (
    ContentView,
    Finding,
    Fix,
    ImageSnaps,
    JournalType,
    Kind,
    PurgeTask,
    PVView,
    RecordView,
    Snapshot,
    TrashView,
)
from cephcsi.audit.snapshot_contents import content_view
from cephcsi.ceph.imagestate import TrashState
from cephcsi.kube.errors import ApiForbidden, ApiNotFound
from cephcsi.volumes.volume_id import VolumeId
from tests.unit.audit.test_classify_snaps import S1, S2, SNAP1, SNAP2, U1, VOL, healthy, only, with_image, with_snapshot

pytestmark = pytest.mark.unit

DRIVER = "rbd.csi.ceph.com"
UID = "0f0e0d0c-0b0a-4909-8807-060504030201"
KEPT = ContentView("snapcontent-1", S1, "snapshot-1", "Delete", "ns/snap-1")


def with_contents(snap: Snapshot, *contents: ContentView) -> Snapshot:
    return replace(snap, contents=contents)


def content(handle: str = "", source_handle: str = "", volume_handle: str = "", driver: str = DRIVER,
            uid: str = UID, deleting: bool = False) -> dict[str, Any]:
    """A VolumeSnapshotContent as the API server returns it (a plain dict)."""
    source = {"snapshotHandle": source_handle} if source_handle else {"volumeHandle": volume_handle}
    obj: dict[str, Any] = {
        "metadata": {"name": "snapcontent-x", **({"deletionTimestamp": "2026-11-25T00:00:00Z"} if deleting else {})},
        "spec": {"driver": driver, "deletionPolicy": "Retain", "source": source,
                 "volumeSnapshotRef": {"namespace": "ns", "name": "snap", **({"uid": uid} if uid else {})}},
    }
    if handle:
        obj["status"] = {"snapshotHandle": handle}
    return obj


def test_contents_are_filtered_by_driver_cluster_and_pool() -> None:
    handle = VolumeId("c1", 3, S1).encode()
    volume = VolumeId("c1", 3, U1).encode()
    dynamic = content_view(content(handle, volume_handle=volume), DRIVER, "c1", 3)
    assert dynamic == ContentView("snapcontent-x", S1, f"snapshot-{UID}", "Retain", "ns/snap")
    imported = content_view(content(source_handle=handle, uid=""), DRIVER, "c1", 3)
    assert imported is not None and (imported.uuid, imported.request_name) == (S1, "")
    assert content_view(content(handle, volume_handle=volume, driver="other"), DRIVER, "c1", 3) is None
    assert content_view(content(handle, volume_handle=volume), DRIVER, "c2", 3) is None
    assert content_view(content(handle, volume_handle=volume), DRIVER, "c1", 4) is None
    assert content_view(content("not-an-id", volume_handle=volume), DRIVER, "c1", 3) is None
    assert content_view({"metadata": {"name": "bare"}}, DRIVER, "c1", 3) is None
    deleting = content_view(content(handle, volume_handle=volume, deleting=True), DRIVER, "c1", 3)
    assert deleting is not None and deleting.deleting


def test_a_content_still_being_made_is_kept_by_its_request_name_when_its_source_is_here() -> None:
    volume = VolumeId("c1", 3, U1).encode()
    pending = content_view(content(volume_handle=volume), DRIVER, "c1", 3)
    assert pending is not None and (pending.uuid, pending.request_name) == ("", f"snapshot-{UID}")
    assert content_view(content(volume_handle=VolumeId("c1", 4, U1).encode()), DRIVER, "c1", 3) is None
    assert content_view(content(volume_handle=volume, uid=""), DRIVER, "c1", 3) is None  # not bound yet


def test_a_snapshot_its_content_names_is_clean_and_without_the_crds_nothing_is_judged() -> None:
    assert classify(with_contents(healthy(), KEPT)) == []
    assert classify(healthy()) == []  # contents None: no kubeconfig, or no snapshot CRDs


def test_a_journaled_snapshot_no_content_names_is_reported_only() -> None:
    finding = only(with_contents(healthy()), Kind.SNAPSHOT_WITHOUT_CONTENT)
    assert (finding.subject, finding.journal, finding.uuid, finding.name, finding.fix) == (
        SNAP1, JournalType.SNAPSHOT, S1, "snap-1", None)
    assert "outside Kubernetes" in finding.why_not
    # A content whose CreateSnapshot is in progress names the entry by its request name.
    pending = replace(KEPT, uuid="", request_name="snap-1")
    assert classify(with_contents(healthy(), pending)) == []


def test_a_content_whose_snapshot_record_is_gone_is_reported_never_repaired() -> None:
    lost = ContentView("snapcontent-lost", S2, "", "Retain", "ns/lost")
    finding = only(with_contents(healthy(), KEPT, lost), Kind.CONTENT_SNAPSHOT_GONE)
    assert (finding.subject, finding.uuid, finding.journal, finding.fix) == ("snapcontent-lost", S2,
                                                                           JournalType.SNAPSHOT, None)
    assert "journal does not know" in finding.detail and "deletionPolicy Retain" in finding.detail
    assert "CO's business" in finding.why_not
    # Still being made: no handle, nothing to compare.
    assert classify(with_contents(healthy(), KEPT, replace(lost, uuid=""))) == []


def test_a_content_whose_snapshot_image_is_gone_blocks_the_record_repair() -> None:
    # The record of snap-2 names an image that is not there: a dangling record, whose removal
    # would leave the content naming nothing.
    snap = with_snapshot(healthy(), "snap-2", S2, RecordView(S2, "snap-2", SNAP2, source_image=VOL))
    assert only(with_contents(snap, KEPT), Kind.DANGLING_RECORD).fix is Fix.REMOVE_RECORD
    named = with_contents(snap, KEPT, ContentView("snapcontent-2", S2, deleting=True))
    found = {f.kind: f for f in classify(named)}
    assert set(found) == {Kind.DANGLING_RECORD, Kind.CONTENT_SNAPSHOT_GONE}
    assert (found[Kind.DANGLING_RECORD].fix, found[Kind.DANGLING_RECORD].why_not) == (
        None, "VolumeSnapshotContent snapcontent-2 names it")
    gone = found[Kind.CONTENT_SNAPSHOT_GONE]
    assert (gone.name, gone.image_name) == ("snap-2", SNAP2) and "being deleted" in gone.detail


def _dangling_key() -> Snapshot:
    return with_snapshot(healthy(), "snap-2", S2, None)


def _orphan_record() -> Snapshot:
    journal = healthy().snap_journal
    records = {**journal.records, S2: RecordView(S2, "snap-2", SNAP2)}
    return replace(healthy(), snap_journal=replace(journal, records=records))


def _orphan_image() -> Snapshot:
    return replace(with_image(healthy(), SNAP2, "sid2"), pvs=(PVView("pv-1", U1, VOL),),
                   image_snaps={**healthy().image_snaps, "sid2": ImageSnaps((SNAP2,))})


def _partial_create() -> Snapshot:
    return with_image(healthy(), SNAP2, "sid2", header=False)


def _unqueued() -> Snapshot:
    return replace(healthy(), trash=(TrashView("sid2", SNAP2, TrashState.NORMAL),), tasks={})


def _half_removed() -> Snapshot:
    return replace(healthy(), trash=(TrashView("sid2", SNAP2, TrashState.REMOVING),),
                   tasks={"sid2": PurgeTask("sid2", 3)})


@pytest.mark.parametrize("seed, kind, fix", [
    (_dangling_key, Kind.DANGLING_KEY, Fix.RELEASE_KEY),
    (_orphan_record, Kind.ORPHAN_RECORD, Fix.REMOVE_RECORD),
    (_orphan_image, Kind.ORPHAN_IMAGE, Fix.TRASH_ORPHAN),
    (_partial_create, Kind.PARTIAL_CREATE, Fix.REMOVE_PARTIAL),
    (_unqueued, Kind.TRASH_UNQUEUED, Fix.PURGE),
    (_half_removed, Kind.TRASH_REMOVING, Fix.PURGE),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_no_repair_touches_a_snapshot_a_content_names(seed: Any, kind: Kind, fix: Fix) -> None:
    def judged(snap: Snapshot) -> Finding:
        return next(f for f in classify(snap) if f.kind is kind)

    assert judged(with_contents(seed(), KEPT)).fix is fix  # the content names another snapshot
    for naming in (ContentView("snapcontent-2", S2), ContentView("snapcontent-2", "", "snap-2")):
        if naming.request_name and kind not in (Kind.DANGLING_KEY, Kind.ORPHAN_RECORD):
            continue  # only journal entries carry the request name
        finding = judged(with_contents(seed(), KEPT, naming))
        assert (finding.fix, finding.why_not) == (None, "VolumeSnapshotContent snapcontent-2 names it"), naming


def test_contents_never_block_a_volume_repair() -> None:
    # The temporary snapshot a killed CreateSnapshot of snap-2 left on its source volume is the
    # volume's debris, removed under the volume's lease, whatever names snap-2.
    snap = replace(healthy(), image_snaps={**healthy().image_snaps, "vid": ImageSnaps((f"cephcsi-tmp-{S2}",))})
    found = {f.kind: f for f in classify(with_contents(snap, KEPT, ContentView("snapcontent-2", S2)))}
    assert set(found) == {Kind.TEMP_SNAPSHOT, Kind.CONTENT_SNAPSHOT_GONE}
    assert found[Kind.TEMP_SNAPSHOT].fix is Fix.REMOVE_TEMP_SNAP


def test_paged_lists_and_a_resource_the_server_does_not_serve() -> None:
    pages = {None: (["a", "b"], "t1"), "t1": (["c"], "")}
    assert list(list_all(lambda token: pages[token], "list things")) == ["a", "b", "c"]

    def refused(status: int) -> Any:
        def fetch(token: str | None) -> tuple[list[Any], str | None]:
            raise ApiException(status=status, reason="no")
        return fetch

    with pytest.raises(ApiNotFound, match="list things: not found"):
        list(list_all(refused(404), "list things"))
    with pytest.raises(ApiForbidden):
        list(list_all(refused(403), "list things"))


def test_without_the_crds_the_report_says_so_and_the_exit_status_does_not_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    options = run.AuditOptions("config.json", "c1", "rbd", credentials=None,  # type: ignore[arg-type]
                               kubeconfig="kubeconfig")
    monkeypatch.setattr(run, "list_pvs", lambda *args: ())
    monkeypatch.setattr(run, "list_contents", lambda *args: None)
    assert run._read_kube(options, 3) == ((), None, (run.NO_SNAPSHOT_CRDS,))
    monkeypatch.setattr(run, "list_contents", lambda *args: (KEPT,))
    assert run._read_kube(options, 3) == ((), (KEPT,), ())
    assert run._read_kube(replace(options, kubeconfig=""), 3) == (None, None, ())

    scope = report.Scope("c1", "rbd", "", "default", "csi-vol-", True)
    result = report.AuditResult(scope, (), None, notes=(run.NO_SNAPSHOT_CRDS,))
    assert result.clean
    doc = json.loads(report.to_json(result))
    assert doc["snapshot_contents"] is False and doc["notes"] == [run.NO_SNAPSHOT_CRDS]
    assert "CRDs are not installed" in report.to_table(result)
    assert json.loads(report.to_json(replace(result, scope=replace(scope, snapshot_contents=True))))[
        "snapshot_contents"] is True


def test_a_snapshot_ceph_csi_journaled_in_another_pool_is_what_its_content_names() -> None:
    """ceph-csi splits a topology volume's snapshot the way it splits the volume: here only the
    image and an empty record object, the record (found by the scan) in the StorageClass pool."""
    split = RecordView(S2, "snap-2", SNAP2, "sid2", journal_pool="0000000000000001")
    snap = with_image(healthy(), SNAP2, "sid2")
    journal = replace(snap.snap_journal, records={**snap.snap_journal.records, S2: RecordView(S2, "", "")},
                      split_records={S2: split})
    named = with_contents(replace(snap, snap_journal=journal), KEPT, ContentView("snapcontent-2", S2, "", "Delete",
                                                                                 "ns/snap-2"))
    assert classify(named) == []
    # Without the split record, the same pool reads as debris a repair would remove.
    alone = with_contents(replace(snap, snap_journal=replace(journal, split_records={})), KEPT,
                          ContentView("snapcontent-2", S2, "", "Delete", "ns/snap-2"))
    assert {f.kind for f in classify(alone)} >= {Kind.CONTENT_SNAPSHOT_GONE, Kind.ORPHAN_RECORD}
