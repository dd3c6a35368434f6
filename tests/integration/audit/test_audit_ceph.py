"""`cephcsi audit` on a real pool where each inconsistency was made on purpose: it finds every
one (exit 1, JSON), `--repair` fixes what is ours and safe, and once the mgr has drained the
trash a second audit is clean (exit 0) with the healthy volume untouched."""
from __future__ import annotations

import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import pytest
import rbd

from cephcsi.ceph import encoding
from cephcsi.ceph import omap as ceph_omap
from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import (
    MOVING,
    NORMAL,
    REMOVING,
    Seeder,
    admin_namespace,
    new_uuid,
    run_audit,
    write_config,
)

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

DRAIN_SECONDS = 120.0
ORPHAN_OWNER = ("shop", "orders-db", "pvc-5f0c1d2e")
TRASHED_OWNER = ("shop", "old-cache", "pvc-77aa")


def owner_of(finding: dict[str, Any]) -> tuple[str, str, str] | None:
    owner = finding["owner"]
    return None if owner is None else (owner["pvc_namespace"], owner["pvc_name"], owner["pv_name"])


def kinds_and_subjects(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(f["kind"], f["subject"]) for f in doc["findings"]}


def seed_everything(s: Seeder) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """Every inconsistency the audit knows, except those that need PVs or only a person can
    fix. Returns the expected (kind, subject) pairs and a few names the test checks later."""
    healthy, healthy_id = s.volume("pvc-healthy")
    orphan = new_uuid()
    s.image(s.image_name(orphan))
    s.owned(s.image_name(orphan), *ORPHAN_OWNER)  # made with --extra-create-metadata; its PV is gone
    dangling_record = new_uuid()
    s.key("pvc-dangling-record", dangling_record)
    s.record(dangling_record, "pvc-dangling-record")
    dangling_key = new_uuid()
    s.key("pvc-dangling-key", dangling_key)
    orphan_record, empty_record = new_uuid(), new_uuid()
    s.record(orphan_record, "pvc-orphan-record")
    s.empty_record(empty_record)
    moving_id = s.trashed(s.image_name(new_uuid()), MOVING)
    moving_named_id = s.half_moved_with_name(s.image_name(new_uuid()))
    removing_id = s.trashed(s.image_name(new_uuid()), REMOVING)
    unqueued_id = s.trashed(s.image_name(new_uuid()), NORMAL, owner=TRASHED_OWNER)
    partial = s.image_name(new_uuid())
    s.partial_create(partial, with_id_object=True)
    journaled_partial = new_uuid()  # a create killed inside `rbd create`, its journal intact
    s.key("pvc-partial", journaled_partial)
    s.record(journaled_partial, "pvc-partial")
    s.partial_create(s.image_name(journaled_partial), with_id_object=False)
    planned = new_uuid()  # a create that wrote the image itself, killed with only its header
    s.key("pvc-planned", planned)
    s.planned_header(planned, "pvc-planned")
    expected = {
        ("dangling-record", "pvc-planned"),
        ("orphan-image", s.image_name(orphan)),
        ("dangling-record", "pvc-dangling-record"),
        ("dangling-record", "pvc-partial"),
        ("dangling-key", "pvc-dangling-key"),
        ("orphan-record", f"csi.volume.{orphan_record}"),
        ("orphan-record", f"csi.volume.{empty_record}"),
        ("trash-moving", f"trash:{moving_id}"),
        ("trash-moving", f"trash:{moving_named_id}"),
        ("trash-removing", f"trash:{removing_id}"),
        ("trash-unqueued", f"trash:{unqueued_id}"),
        ("partial-create", partial),
        ("partial-create", s.image_name(journaled_partial)),
    }
    return expected, {"healthy": healthy, "healthy_id": healthy_id, "orphan": s.image_name(orphan),
                      "unqueued_id": unqueued_id}


def omap(io: Any, obj: str) -> dict[str, bytes]:
    return ceph_omap.read_raw(io, obj) or {}


def audit_until_drained(cluster: CephTestCluster, config: str, io: Any) -> dict[str, Any]:
    """Audit until it is clean and the mgr has purged the trash (queued purges are not
    findings, so the audit can be clean before the trash is empty)."""
    deadline = time.monotonic() + DRAIN_SECONDS
    while True:
        rc, doc, _ = run_audit(cluster, config)
        trash = omap(io, "rbd_trash")  # raw: every state, whatever librbd's listing hides
        if (rc == 0 and not trash) or time.monotonic() > deadline:
            assert rc == 0, f"still not clean after {DRAIN_SECONDS:g}s: {doc['findings']}"
            assert trash == {}, f"the mgr did not drain the trash in {DRAIN_SECONDS:g}s: {trash}"
            return doc
        time.sleep(3)


def test_audit_finds_every_seeded_inconsistency_and_repair_cleans_the_pool(
        ceph_cluster: CephTestCluster, tmp_path: Path) -> None:
    namespace = f"audit-{uuidlib.uuid4().hex[:8]}"
    config = write_config(ceph_cluster, str(tmp_path / "config.json"), namespace)
    with admin_namespace(ceph_cluster, namespace) as io:
        seeder = Seeder(io)
        seeder.check_trash_encoding()
        expected, names = seed_everything(seeder)

        rc, doc, _ = run_audit(ceph_cluster, config)
        assert rc == 1
        assert kinds_and_subjects(doc) == expected
        assert doc["rados_namespace"] == namespace and not doc["clean"] and not doc["repaired"]
        orphan = next(f for f in doc["findings"] if f["kind"] == "orphan-image")
        assert orphan["fix"] is None and "kubeconfig" in orphan["why_not"]
        # The image metadata says whose the orphan was, and whose the trashed image (read by id).
        owners = {f["subject"]: owner_of(f) for f in doc["findings"]}
        assert owners.pop(names["orphan"]) == ORPHAN_OWNER
        assert owners.pop(f"trash:{names['unqueued_id']}") == TRASHED_OWNER
        assert set(owners.values()) == {None}, owners
        assert not doc["notes"], doc["notes"]

        rc, doc, _ = run_audit(ceph_cluster, config, "--list-images")
        assert rc == 1 and kinds_and_subjects(doc) == expected
        images = {i["name"]: i for i in doc["images"]}
        assert images[seeder.image_name(names["healthy"])]["request_name"] == "pvc-healthy"
        assert images[seeder.image_name(names["healthy"])]["owner"] is None
        assert images[names["orphan"]]["owner"] == dict(zip(("pvc_namespace", "pvc_name", "pv_name"), ORPHAN_OWNER))
        assert images[names["orphan"]]["request_name"] == ""

        rc, doc, _ = run_audit(ceph_cluster, config, "--repair")
        outcomes = {(f["kind"], f["subject"]): f["repair"]["outcome"] for f in doc["findings"]}
        assert outcomes.pop(("orphan-image", names["orphan"])) == "skipped"
        assert set(outcomes.values()) == {"repaired"}, doc["findings"]
        assert rc == 1  # the orphan image is left for a person (no --kubeconfig)

        # Untouched: the healthy volume, and the orphan (only report without PVs to rule out).
        with rbd.Image(io, seeder.image_name(names["healthy"]), read_only=True) as image:
            assert image.id() == names["healthy_id"]
        assert omap(io, "csi.volumes.default") == {"csi.volume.pvc-healthy": names["healthy"].encode()}
        assert omap(io, f"csi.volume.{names['healthy']}")["csi.volname"] == b"pvc-healthy"
        rbd.Image(io, names["orphan"], read_only=True).close()

        rbd.RBD().remove(io, names["orphan"])  # the operator's decision
        audit_until_drained(ceph_cluster, config, io)
        objects = {o.key for o in io.list_objects()}
        assert {o for o in objects if o.startswith("csi.volume.")} == {f"csi.volume.{names['healthy']}"}
        assert {o for o in objects if o.startswith("rbd_header.")} == {f"rbd_header.{names['healthy_id']}"}
        assert set(rbd.RBD().list(io)) == {seeder.image_name(names["healthy"])}


def test_a_trash_entry_the_mgr_cannot_purge_is_reported_and_left_alone(
        ceph_cluster: CephTestCluster, tmp_path: Path) -> None:
    namespace = f"audit-{uuidlib.uuid4().hex[:8]}"
    config = write_config(ceph_cluster, str(tmp_path / "config.json"), namespace)
    with admin_namespace(ceph_cluster, namespace) as io:
        seeder = Seeder(io)
        name = seeder.image_name(new_uuid())
        image_id = seeder.image(name)
        with rbd.Image(io, name) as image:
            image.create_snap("keep")  # librbd refuses to purge an image with snapshots
        rbd.RBD().trash_move(io, name, 0)
        ceph_cluster.admin("ceph", "rbd", "task", "add", "trash", "remove",
                           f"{ceph_cluster.pool}/{namespace}/{image_id}")
        deadline = time.monotonic() + 60
        while True:
            rc, doc, _ = run_audit(ceph_cluster, config)
            if rc == 1 or time.monotonic() > deadline:
                break
            time.sleep(2)  # until the mgr's first attempt has failed
        assert kinds_and_subjects(doc) == {("trash-unpurgeable", f"trash:{image_id}")}
        assert "errno" in doc["findings"][0]["detail"]

        rc, doc, _ = run_audit(ceph_cluster, config, "--repair")
        assert rc == 1 and doc["findings"][0]["repair"]["outcome"] == "skipped"
        assert [e["id"] for e in rbd.RBD().trash_list(io)] == [image_id]

        rbd.RBD().trash_restore(io, image_id, name)  # clean up: the operator's way out
        with rbd.Image(io, name) as image:
            image.remove_snap("keep")
        rbd.RBD().remove(io, name)


def test_an_image_a_killed_create_left_unlisted_is_listed_by_repair(
        ceph_cluster: CephTestCluster, tmp_path: Path) -> None:
    """A librbd that writes the directory entry last (ceph/ceph PR 68612), killed just before
    it: header and id object, no directory entry. Built with a rados write (the entry removed
    from a complete volume); the repair adds the entry, and the volume is whole again."""
    namespace = f"audit-{uuidlib.uuid4().hex[:8]}"
    config = write_config(ceph_cluster, str(tmp_path / "config.json"), namespace)
    with admin_namespace(ceph_cluster, namespace) as io:
        seeder = Seeder(io)
        uuid, image_id = seeder.volume("pvc-unlisted")
        name = seeder.image_name(uuid)
        io.execute("rbd_directory", "rbd", "dir_remove_image", encoding.string(name) + encoding.string(image_id))
        assert rbd.RBD().list(io) == []

        rc, doc, _ = run_audit(ceph_cluster, config)
        assert rc == 1 and kinds_and_subjects(doc) == {("unlisted-image", name)}
        assert doc["findings"][0]["fix"] == "add-directory-entry"

        rc, doc, _ = run_audit(ceph_cluster, config, "--repair")
        assert doc["findings"][0]["repair"]["outcome"] == "repaired", doc["findings"]
        assert rbd.RBD().list(io) == [name]
        with rbd.Image(io, name, read_only=True) as image:
            assert image.id() == image_id and image.read(0, 4) == b"data"
        assert run_audit(ceph_cluster, config)[0] == 0

        rbd.RBD().remove(io, name)
        io.remove_object(f"csi.volume.{uuid}")
        seeder.remove_omap("csi.volumes.default", ("csi.volume.pvc-unlisted",))
