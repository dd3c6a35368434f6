"""The node's reclaim-space pass: which staged volumes it trims (the claim's recorded run newer
than the last one honoured here), never one that is busy, and the PV names it finds in the
mount table. The stage records are real files in a temporary kubelet directory; fstrim is a
fake runner and the mount check a fake table (the real ones run in tests/integration/node and
tests/vm)."""
from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cephcsi.locks import KeyLocks
from cephcsi.node import mounts, reclaim, reclaim_claims, reclaim_loop, stage_record
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

RUN_1 = datetime(2026, 11, 27, 0, 0, tzinfo=UTC)
RUN_2 = datetime(2026, 11, 28, 0, 0, tzinfo=UTC)


def staged(kubelet: Path, name: str, volume_id: str, **changes: object) -> stage_record.StageRecord:
    staging = kubelet / "plugins/kubernetes.io/csi/rbd.csi.ceph.com" / name / "globalmount"
    staging.mkdir(parents=True)
    values: dict[str, object] = dict(volume_id=volume_id, staging_path=str(staging), cluster_id="c", pool="p",
                                     image=f"img-{volume_id}", namespace="", mapper="krbd",
                                     access_type=stage_record.ACCESS_MOUNT, fs_type="ext4", device="/dev/rbd0",
                                     staged=True)
    values.update(changes)
    record = stage_record.StageRecord(**values)  # type: ignore[arg-type]
    stage_record.save(record)
    return record


def entry(point: str, minor: int = 0) -> mounts.MountEntry:
    return mounts.MountEntry(mount_id=40 + minor, parent_id=1, major=252, minor=minor, root="/", mount_point=point,
                             options=("rw",), fs_type="ext4", source=f"/dev/rbd{minor}", super_options=("rw",))


@pytest.fixture
def kubelet(tmp_path: Path) -> Path:
    return tmp_path / "kubelet"


def make_pass(kubelet: Path, tmp_path: Path, requested: dict[str, datetime], locks: KeyLocks | None = None,
              runner: FakeRunner | None = None) -> tuple[reclaim_loop.NodeTrimPass, FakeRunner, list[list[str]]]:
    runner = runner or FakeRunner(lambda argv: (0, f"{argv[-1]}: 1 MiB (1048576 bytes) trimmed\n", ""))
    asked: list[list[str]] = []

    def requests(records: list[stage_record.StageRecord]) -> dict[str, datetime]:
        asked.append(sorted(r.volume_id for r in records))
        return dict(requested)

    node_pass = reclaim_loop.NodeTrimPass(str(kubelet), str(tmp_path / "state"), locks or KeyLocks("volume"),
                                          runner, 30.0, requests, interval=60.0)
    return node_pass, runner, asked


def test_a_recorded_run_is_trimmed_once(kubelet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vol = staged(kubelet, "a", "vol-a")
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: [entry(vol.mount_path)])
    requested = {"vol-a": RUN_1}
    node_pass, runner, _ = make_pass(kubelet, tmp_path, requested)
    assert [(r.volume_id, r.outcome) for r in node_pass.run_once()] == [("vol-a", reclaim.TRIMMED)]
    assert node_pass.run_once() == []  # honoured: not again, also not after a restart (state on disk)
    again, _, _ = make_pass(kubelet, tmp_path, requested, runner=runner)
    assert again.run_once() == []
    requested["vol-a"] = RUN_2  # the leader ran it again
    assert [r.volume_id for r in again.run_once()] == ["vol-a"]
    assert [c.argv[0] for c in runner.calls] == ["fstrim", "fstrim"]


def test_volumes_without_a_run_block_and_read_only_ones_are_not_asked_for(
        kubelet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = staged(kubelet, "a", "vol-a")
    staged(kubelet, "b", "vol-b", read_only=True)
    staged(kubelet, "c", "vol-c", staged=False)
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: [entry(plain.mount_path)])
    node_pass, runner, asked = make_pass(kubelet, tmp_path, {})
    assert node_pass.run_once() == [] and runner.calls == []
    assert asked == [["vol-a"]]


def test_nothing_staged_asks_the_api_nothing(kubelet: Path, tmp_path: Path) -> None:
    node_pass, _, asked = make_pass(kubelet, tmp_path, {"vol-a": RUN_1})
    assert node_pass.run_once() == [] and asked == []


def test_a_busy_volume_waits_for_the_next_pass(kubelet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vol = staged(kubelet, "a", "vol-a")
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: [entry(vol.mount_path)])
    locks = KeyLocks("volume")
    node_pass, runner, _ = make_pass(kubelet, tmp_path, {"vol-a": RUN_1}, locks=locks)
    with locks.hold("vol-a"):  # e.g. NodeUnstageVolume running
        assert node_pass.run_once() == [] and runner.calls == []
    assert [r.volume_id for r in node_pass.run_once()] == ["vol-a"]


def test_pv_names_come_from_the_publish_bind_mounts_of_the_staging_filesystem(kubelet: Path) -> None:
    vol = staged(kubelet, "a", "vol-a")
    table = [
        entry(vol.mount_path, minor=0),
        entry("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-111/mount", minor=0),
        entry("/var/lib/kubelet/pods/uid-2/volumes/kubernetes.io~csi/pvc-222/mount", minor=1),  # another device
        entry("/var/lib/kubelet/pods/uid-3/volumes/kubernetes.io~empty-dir/x", minor=0),
    ]
    assert reclaim_claims.pv_names(vol, table) == {"pvc-111"}
    assert reclaim_claims.pv_names(vol, table[1:]) == set()  # staging not mounted: nothing


def test_an_unreadable_state_file_means_trim_again(kubelet: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    vol = staged(kubelet, "a", "vol-a")
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: [entry(vol.mount_path)])
    os.makedirs(tmp_path / "state")
    (tmp_path / "state" / reclaim_loop.STATE_FILE).write_text("{not json")
    node_pass, _, _ = make_pass(kubelet, tmp_path, {"vol-a": RUN_1})
    assert [r.volume_id for r in node_pass.run_once()] == ["vol-a"]
    assert reclaim_loop.TrimState(str(tmp_path / "state")).load() == {"vol-a": RUN_1}
