"""The claim an image belongs to (its `--extra-create-metadata` owner keys) on audit findings
and in the `--list-images` listing: which images are read, how the owner is attached, and how
the table and the JSON show it."""
from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from cephcsi.audit import owners, report, scan
from cephcsi.audit.classify import classify
from cephcsi.audit.model import (
    ContentView,
    ImageOwner,
    Kind,
    PVView,
    RecordView,
    SnapJournalView,
    Snapshot,
    TrashView,
)
from cephcsi.ceph import image_metadata
from cephcsi.ceph.imagestate import TrashState
from cephcsi.cli import audit as cli
from cephcsi.errors import Unavailable
from cephcsi.volumes import metadata

pytestmark = pytest.mark.unit

U1 = "11111111-1111-4111-8111-111111111111"
U2 = "22222222-2222-4222-8222-222222222222"
U3 = "33333333-3333-4333-8333-333333333333"
IMG1, IMG2, IMG3 = f"csi-vol-{U1}", f"csi-vol-{U2}", f"csi-vol-{U3}"
SCOPE = report.Scope("c1", "rbd", "", "default", "csi-vol-", False)
OWNER = ImageOwner("db", "data-0", "pvc-0b1c")
META = {metadata.PVC_NAMESPACE_KEY: "db", metadata.PVC_NAME_KEY: "data-0", metadata.PV_NAME_KEY: "pvc-0b1c",
        "rbd.other": "x"}


def pool() -> Snapshot:
    """A healthy volume (IMG1), an orphan image (IMG2), a trashed image of ours (id3), debris
    without a header (IMG3) and an image that is not ours ("backup")."""
    return Snapshot(
        prefix="csi-vol-", name_keys={"pvc-1": U1}, records={U1: RecordView(U1, "pvc-1", IMG1, "id1")},
        directory={IMG1: "id1", IMG2: "id2", IMG3: "idx", "backup": "id9"},
        id_objects={IMG1: "id1", IMG2: "id2", "backup": "id9"},
        headers=frozenset({"id1", "id2", "id3", "id9"}),
        trash=(TrashView("id3", f"csi-vol-{U3[:-1]}4", TrashState.NORMAL),), tasks={}, now=1.0,
    )


def test_owner_comes_from_the_owner_keys_only() -> None:
    assert ImageOwner.from_metadata(META) == OWNER
    assert ImageOwner.from_metadata({"rbd.other": "x"}) is None
    assert OWNER.text == "db/data-0 (pvc-0b1c)"
    assert ImageOwner(pv_name="pvc-9").text == "pvc-9"


def test_only_openable_images_of_findings_are_read() -> None:
    snap = pool()
    findings = classify(snap)
    assert {f.kind for f in findings} == {Kind.ORPHAN_IMAGE, Kind.PARTIAL_CREATE, Kind.TRASH_UNQUEUED}
    # The partial create has no header: nothing to open. The healthy image is no finding.
    assert owners.finding_targets(snap, findings) == [(IMG2, "id2"), (f"csi-vol-{U3[:-1]}4", "id3")]


def test_findings_carry_their_images_owner() -> None:
    snap = pool()
    found = owners.with_owners(snap, classify(snap), {"id2": OWNER, "id1": ImageOwner("x", "y")})
    by_kind = {f.kind: f for f in found}
    assert by_kind[Kind.ORPHAN_IMAGE].owner == OWNER
    assert by_kind[Kind.PARTIAL_CREATE].owner is None and by_kind[Kind.TRASH_UNQUEUED].owner is None


def test_the_listing_names_request_pvs_and_owner_of_every_live_image() -> None:
    snap = replace(pool(), pvs=(PVView("pv-1", U1, IMG1, "Bound"), PVView("static", "", "backup")))
    assert owners.live_images(snap) == [("backup", "id9"), (IMG1, "id1"), (IMG2, "id2")]
    entries = {e.name: e for e in owners.listing(snap, {"id1": OWNER})}
    assert (entries[IMG1].request_name, entries[IMG1].pvs, entries[IMG1].owner) == ("pvc-1", ("pv-1",), OWNER)
    assert (entries[IMG2].request_name, entries[IMG2].pvs, entries[IMG2].owner) == ("", (), None)
    assert entries["backup"].pvs == ("static",)
    assert all(e.contents == () for e in entries.values())


def test_the_listing_names_the_contents_of_a_snapshot_image() -> None:
    """A snapshot image is named by VolumeSnapshotContents, by handle, or by request name while
    the snapshotter's create is in progress; a volume image never is."""
    snap_image = f"csi-snap-{U3}"
    journal = SnapJournalView(name_keys={"snapshot-77": U3},
                              records={U3: RecordView(U3, "snapshot-77", snap_image, "id4")})
    snap = replace(pool(), directory={**pool().directory, snap_image: "id4"},
                   id_objects={**pool().id_objects, snap_image: "id4"}, headers=pool().headers | {"id4"},
                   snap_journal=journal,
                   contents=(ContentView("snapcontent-a", uuid=U3), ContentView("snapcontent-b", request_name="snapshot-77"),
                             ContentView("snapcontent-other", uuid=U2)))
    entries = {e.name: e for e in owners.listing(snap, {})}
    assert entries[snap_image].request_name == "snapshot-77"
    assert entries[snap_image].contents == ("snapcontent-a", "snapcontent-b")
    assert entries[IMG1].contents == () and entries[IMG2].contents == ()
    result = report.AuditResult(SCOPE, (), None, images=tuple(entries.values()))
    row = next(line for line in report.to_table(result).splitlines() if line.startswith(snap_image))
    assert row.split()[2] == "snapcontent-a,snapcontent-b"
    listed = {i["name"]: i for i in json.loads(report.to_json(result))["images"]}
    assert listed[snap_image]["contents"] == ["snapcontent-a", "snapcontent-b"] and listed[IMG1]["contents"] == []


def test_metadata_is_read_by_id_and_failures_become_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[tuple[Any, ...]] = []

    def read(io: Any, name: str, image_id: str = "") -> dict[str, str]:
        opened.append((name, image_id))
        if image_id == "bad":
            raise Unavailable("timed out")
        return META if image_id == "id2" else {}

    monkeypatch.setattr(image_metadata, "read", read)  # scan reads through the module
    found, notes = scan.read_owners(None, [(IMG2, "id2"), (IMG1, "id1"), ("x", "bad")])  # type: ignore[arg-type]
    assert found == {"id2": OWNER} and opened == [(IMG2, "id2"), (IMG1, "id1"), ("x", "bad")]
    assert len(notes) == 1 and "'x'" in notes[0] and "timed out" in notes[0]


def _result(images: bool = False) -> report.AuditResult:
    snap = pool()
    found = owners.with_owners(snap, classify(snap), {"id2": OWNER})
    listing = owners.listing(snap, {"id2": OWNER}) if images else None
    return report.AuditResult(SCOPE, tuple(found), None, images=listing)


def test_json_shows_the_owner_of_each_finding_and_the_listing_when_asked() -> None:
    doc = json.loads(report.to_json(_result()))
    orphan = next(f for f in doc["findings"] if f["kind"] == "orphan-image")
    assert orphan["owner"] == {"pvc_namespace": "db", "pvc_name": "data-0", "pv_name": "pvc-0b1c"}
    assert all(f["owner"] is None for f in doc["findings"] if f["kind"] != "orphan-image")
    assert "images" not in doc
    listed = {i["name"]: i for i in json.loads(report.to_json(_result(images=True)))["images"]}
    assert listed[IMG2]["owner"]["pvc_name"] == "data-0" and listed[IMG1]["request_name"] == "pvc-1"
    assert listed[IMG1]["owner"] is None and listed[IMG1]["pvs"] == []


def test_table_shows_the_owner_under_the_finding_and_the_listing() -> None:
    text = report.to_table(_result())
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("orphan-image"))
    assert lines[at + 1].strip() == "owner: db/data-0 (pvc-0b1c)" and lines[at + 2].strip().startswith("->")
    assert "IMAGE" not in text
    listing = report.to_table(_result(images=True))
    assert "OWNER (metadata)" in listing and "3 image(s)" in listing
    row = next(line for line in listing.splitlines() if line.startswith(IMG2))
    assert row.split() == [IMG2, "-", "-", "db/data-0", "(pvc-0b1c)"]


def test_list_images_flag_reaches_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.KEY_ENV, "AQBvHARrtzhtKhAANqiNk4814H0PUS4/xkGJKg==")
    base = ["--cluster-id", "c1", "--pool", "rbd", "--user", "csi"]
    assert cli.options_from(cli.build_parser().parse_args(base + ["--list-images"])).list_images
    assert not cli.options_from(cli.build_parser().parse_args(base)).list_images
