"""The stager's filesystem step with fakes for the mapper and the commands: what a resumed stage
does with a stage record that says an earlier mkfs started (issue 11, data safety)."""
from __future__ import annotations

import json
import os

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.node import stage_record
from cephcsi.node.mappers.base import KRBD, MapRequest
from cephcsi.node.mounts import Mounter
from cephcsi.node.requests import StageRequest, VolumeAccess
from cephcsi.node.stage_record import RECORD_NAME, ImageSpec, StageRecord
from cephcsi.node.stager import Stager
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOLUME = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"
FS_UUID = "8d2c7b0e-0000-4000-8000-000000000001"


class FakeMapper:
    """A krbd stand-in whose 'device' is a plain file (blkid and mount are faked anyway)."""

    name = KRBD

    def __init__(self, device: str) -> None:
        self.device = device
        self.mapped = False

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        return ""

    def map(self, request: MapRequest) -> str:
        self.mapped = True
        return self.device

    def find(self, record: StageRecord) -> str | None:
        return self.device if self.mapped else None

    def unmap(self, record: StageRecord) -> None:
        self.mapped = False


class FixedChoice:
    def for_volume(self, mounter: str) -> str:
        return KRBD


@pytest.fixture
def device(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "dev")
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)
    return path


def _stager(runner: FakeRunner, mapper: FakeMapper) -> Stager:
    return Stager(
        {KRBD: mapper}, FixedChoice(), Mounter(runner, 10), runner, 10, "",  # type: ignore[arg-type]
        read_mounts=lambda: [],
    )


def _request(staging: str, fs_type: str = "ext4") -> StageRequest:
    return StageRequest(
        volume_id=VOLUME, staging_path=staging, cluster_id="ceph", monitors="127.0.0.1:6789",
        image=ImageSpec("rbd", "csi-vol-1"), credentials=Credentials("csi", "k"),
        access=VolumeAccess("mount", fs_type=fs_type),
    )


def _runner(blkid_stdout: str, staging: str, seen: list[dict[str, object]] | None = None) -> FakeRunner:
    def respond(argv: list[str]) -> tuple[int, str, str] | None:
        if argv[0] == "blkid":
            return (0, blkid_stdout, "") if blkid_stdout else (2, "", "")
        if argv[0].startswith("mkfs") and seen is not None:
            with open(os.path.join(staging, RECORD_NAME)) as handle:
                seen.append(json.load(handle))
        return None

    return FakeRunner(respond)


def test_old_record_mid_mkfs_resumes_without_formatting(tmp_path: os.PathLike[str], device: str) -> None:
    """Node A's mkfs completed, A died before the stage did (record: mkfs_started, written by the
    previous version: no UUID); node B then used the filesystem. A's resumed stage must mount
    it as it is. (Before the fix it ran `mkfs.ext4 -F` over it.)"""
    staging = os.path.join(tmp_path, "staging")
    os.makedirs(staging)
    old = {
        "access_type": "mount", "cluster_id": "ceph", "device": device, "formatted": False, "fs_type": "ext4",
        "image": "csi-vol-1", "mapper": KRBD, "mkfs_started": True, "mount_flags": [], "namespace": "",
        "pool": "rbd", "read_only": False, "staged": False, "staging_path": staging, "unmap_options": [],
        "version": 1, "volume_id": VOLUME, "work_dir": "",
    }
    with open(os.path.join(staging, RECORD_NAME), "w") as handle:
        json.dump(old, handle)
    runner = _runner(f"UUID={FS_UUID}\nTYPE=ext4\nUSAGE=filesystem\n", staging)
    _stager(runner, FakeMapper(device)).stage(_request(staging))
    assert [a[0] for a in runner.argvs()] == ["blkid", "mount"]
    record = stage_record.load(staging)
    assert record is not None and record.staged and record.formatted and not record.mkfs_started


@pytest.mark.parametrize("fs_type", ["ext4", "xfs"])
def test_new_record_mid_mkfs_resumes_without_formatting(tmp_path: os.PathLike[str], device: str, fs_type: str) -> None:
    staging = os.path.join(tmp_path, "staging")
    os.makedirs(staging)
    mapper = FakeMapper(device)
    # First attempt: the device is empty; the UUID is recorded before mkfs runs.
    seen: list[dict[str, object]] = []
    first = _runner("", staging, seen)
    _stager(first, mapper).stage(_request(staging, fs_type))
    mkfs = [a for a in first.argvs() if a[0].startswith("mkfs")]
    assert len(mkfs) == 1 and "-F" not in mkfs[0] and "-f" not in mkfs[0]
    assert seen and seen[0]["mkfs_started"] is True
    recorded_uuid = str(seen[0]["mkfs_uuid"])
    assert recorded_uuid in " ".join(mkfs[0])
    # Make the record look like a crash right after mkfs, then stage again over a filled filesystem.
    record = stage_record.load(staging)
    assert record is not None
    record.staged, record.formatted, record.mkfs_started = False, False, True
    stage_record.save(record)
    again = _runner(f"UUID={recorded_uuid}\nTYPE={fs_type}\nUSAGE=filesystem\n", staging)
    _stager(again, mapper).stage(_request(staging, fs_type))
    assert [a[0] for a in again.argvs()] == ["blkid", "mount"]


def test_resumed_stage_refuses_a_foreign_signature(tmp_path: os.PathLike[str], device: str) -> None:
    from cephcsi.errors import FailedPrecondition

    staging = os.path.join(tmp_path, "staging")
    os.makedirs(staging)
    mapper = FakeMapper(device)
    mapper.mapped = True
    record = StageRecord(
        volume_id=VOLUME, staging_path=staging, cluster_id="ceph", pool="rbd", image="csi-vol-1", namespace="",
        mapper=KRBD, access_type="mount", fs_type="ext4", device=device, mkfs_started=True, mkfs_uuid=FS_UUID,
    )
    stage_record.save(record)
    runner = _runner("PTUUID=x\nPTTYPE=dos\n", staging)
    with pytest.raises(FailedPrecondition, match=f"volume {VOLUME}.*dos partition table.*interrupted"):
        _stager(runner, mapper).stage(_request(staging))
    assert not any(a[0].startswith("mkfs") for a in runner.argvs())
