from __future__ import annotations

import json
import os

import pytest

from cephcsi.errors import Internal
from cephcsi.node import stage_record
from cephcsi.node.stage_record import RECORD_NAME, LoopBacking, StageRecord

pytestmark = pytest.mark.unit


def _record(staging: str) -> StageRecord:
    return StageRecord(
        volume_id="0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555",
        staging_path=staging,
        cluster_id="ceph",
        pool="rbd",
        image="csi-vol-1",
        namespace="ns",
        mapper="fuse",
        access_type="mount",
        fs_type="xfs",
        mount_flags=["noatime"],
        unmap_options=["force"],
        work_dir="/var/lib/cephcsi/fuse/abc",
    )


def test_round_trip(tmp_path: os.PathLike[str]) -> None:
    staging = str(tmp_path)
    record = _record(staging)
    assert stage_record.load(staging) is None
    stage_record.save(record)
    assert stage_record.load(staging) == record
    record.device = "/dev/loop3"
    record.staged = True
    stage_record.save(record)
    loaded = stage_record.load(staging)
    assert loaded == record
    assert loaded is not None and loaded.image_spec.__str__() == "rbd/ns/csi-vol-1"
    assert loaded.mount_path == os.path.join(staging, "fs")
    # Atomic replace leaves no temp files behind.
    assert sorted(os.listdir(staging)) == [RECORD_NAME]
    stage_record.remove(staging)
    stage_record.remove(staging)  # idempotent
    assert stage_record.load(staging) is None


def test_block_mount_path(tmp_path: os.PathLike[str]) -> None:
    record = _record(str(tmp_path))
    record.access_type = "block"
    assert record.mount_path == os.path.join(str(tmp_path), "block")


def test_unknown_fields_are_ignored_but_version_is_checked(tmp_path: os.PathLike[str]) -> None:
    staging = str(tmp_path)
    stage_record.save(_record(staging))
    path = os.path.join(staging, RECORD_NAME)
    doc = json.loads(open(path).read())
    doc["added_later"] = 1
    open(path, "w").write(json.dumps(doc))
    assert stage_record.load(staging) is not None
    doc["version"] = 99
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(Internal, match="unknown format"):
        stage_record.load(staging)


def test_corrupt_record_is_an_error_not_nothing(tmp_path: os.PathLike[str]) -> None:
    staging = str(tmp_path)
    open(os.path.join(staging, RECORD_NAME), "w").write("{not json")
    with pytest.raises(Internal, match="unreadable"):
        stage_record.load(staging)
    open(os.path.join(staging, RECORD_NAME), "w").write(json.dumps({"version": 1}))
    with pytest.raises(Internal, match="incomplete"):
        stage_record.load(staging)


def test_missing_staging_dir(tmp_path: os.PathLike[str]) -> None:
    assert stage_record.load(os.path.join(str(tmp_path), "nope")) is None


def test_record_of_an_older_version_loads(tmp_path: os.PathLike[str]) -> None:
    """A record written before mkfs UUIDs and loop identities were recorded (mid-mkfs crash)."""
    staging = str(tmp_path)
    old = {
        "access_type": "mount", "cluster_id": "ceph", "device": "/dev/loop3", "formatted": False,
        "fs_type": "ext4", "image": "csi-vol-1", "mapper": "fuse", "mkfs_started": True, "mount_flags": [],
        "namespace": "", "pool": "rbd", "read_only": False, "staged": False, "staging_path": staging,
        "unmap_options": [], "version": 1, "volume_id": "vol-1", "work_dir": "/var/lib/cephcsi/fuse/abc",
    }
    with open(os.path.join(staging, RECORD_NAME), "w") as handle:
        json.dump(old, handle)
    loaded = stage_record.load(staging)
    assert loaded is not None and loaded.mkfs_started
    assert (loaded.mkfs_uuid, loaded.loop) == ("", None)


def test_loop_identity_round_trip(tmp_path: os.PathLike[str]) -> None:
    staging = str(tmp_path)
    record = _record(staging)
    record.mkfs_uuid = "0b5c1a9e-7d1e-4a39-9a1b-2f1c7a1c0001"
    record.loop = LoopBacking("/dev/loop3", 12, "/var/lib/cephcsi/fuse/abc/mnt/csi-vol-1", 0, 57, 2)
    stage_record.save(record)
    assert stage_record.load(staging) == record
    path = os.path.join(staging, RECORD_NAME)
    doc = json.loads(open(path).read())
    doc["loop"] = {"device": "/dev/loop3", "unknown_field": 1}
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(Internal, match="incomplete"):
        stage_record.load(staging)
