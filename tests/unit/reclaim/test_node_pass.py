"""The node's reclaim-space pass: which staged volumes it trims (the claim's recorded run newer
than the last one honoured here, of this driver only), never one that is busy, a failed trim
not again before the next run, the PV names it finds in the mount table, and the claim reader's
cache of each volume's claim. The stage records are real files in a temporary kubelet
directory; fstrim is a fake runner, the mount check a fake table and device numbers, the API a
fake CoreV1Api (the real ones run in tests/integration/node, tests/integration/kube and tests/vm)."""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cephcsi.cli.args import parse_settings
from cephcsi.locks import KeyLocks
from cephcsi.node import devices, mounts, reclaim, reclaim_claims, reclaim_loop, stage_record
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

DRIVER = "rbd.csi.ceph.com"
RUN_1 = datetime(2026, 11, 27, 0, 0, tzinfo=UTC)
RUN_2 = datetime(2026, 11, 28, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def rbd0(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recorded device (/dev/rbd0) has the numbers of the fake mounts (252:0)."""
    monkeypatch.setattr(devices, "device_numbers", lambda device: (252, 0))


def staged(kubelet: Path, name: str, volume_id: str, driver_dir: str = DRIVER,
           **changes: object) -> stage_record.StageRecord:
    staging = kubelet / "plugins/kubernetes.io/csi" / driver_dir / name / "globalmount"
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

    node_pass = reclaim_loop.NodeTrimPass(str(kubelet), DRIVER, str(tmp_path / "state"), locks or KeyLocks("volume"),
                                          runner, requests, interval=600.0)
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


def test_a_failed_trim_waits_for_the_next_recorded_run(kubelet: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trim that fails or times out would hold the volume's lock again every pass: it is
    recorded and tried again only for the leader's next run."""
    vol = staged(kubelet, "a", "vol-a")
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: [entry(vol.mount_path)])
    requested = {"vol-a": RUN_1}
    runner = FakeRunner(lambda argv: (1, "", "fstrim: /x: FITRIM ioctl failed: Input/output error"))
    node_pass, _, _ = make_pass(kubelet, tmp_path, requested, runner=runner)
    [failed] = node_pass.run_once()
    assert failed.outcome == reclaim.FAILED and "Input/output error" in failed.reason
    assert node_pass.run_once() == [] and len(runner.calls) == 1  # not again this run
    assert runner.calls[0].timeout == reclaim.TRIM_TIMEOUT
    requested["vol-a"] = RUN_2
    assert [r.outcome for r in node_pass.run_once()] == [reclaim.FAILED] and len(runner.calls) == 2


def test_only_this_drivers_volumes_are_trimmed(kubelet: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Another cephcsi instance (another --drivername) on the node trims its own volumes under its
    own locks; kubelet's pre-1.24 pv/<name> layout is ours when its vol_data.json says so."""
    ours = staged(kubelet, "a", "vol-a")
    theirs = staged(kubelet, "b", "vol-b", driver_dir="other.rbd.csi.ceph.com")
    legacy_ours = staged(kubelet, "pv-c", "vol-c", driver_dir="pv")
    legacy_theirs = staged(kubelet, "pv-d", "vol-d", driver_dir="pv")
    for record, driver in ((legacy_ours, DRIVER), (legacy_theirs, "other.rbd.csi.ceph.com")):
        Path(record.staging_path).parent.joinpath("vol_data.json").write_text(
            json.dumps({"driverName": driver, "volumeHandle": record.volume_id}))
    staged(kubelet, "pv-e", "vol-e", driver_dir="pv")  # no vol_data.json: not known to be ours
    table = [entry(r.mount_path) for r in (ours, theirs, legacy_ours, legacy_theirs)]
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: table)
    node_pass, runner, asked = make_pass(kubelet, tmp_path, dict.fromkeys(["vol-a", "vol-b", "vol-c", "vol-d"], RUN_1))
    assert sorted(r.volume_id for r in node_pass.run_once()) == ["vol-a", "vol-c"]
    assert asked == [["vol-a", "vol-c"]]
    assert sorted(c.argv[-1] for c in runner.calls) == sorted([ours.mount_path, legacy_ours.mount_path])


class FakeCoreApi:
    """The two reads KubeTrimRequests makes, counted."""

    def __init__(self) -> None:
        self.pvs = {"pvc-111": ("vol-a", "ns", "data", "uid-1")}
        self.claims = {("ns", "data"): ("uid-1", RUN_1)}
        self.reads: list[str] = []

    def read_persistent_volume(self, name: str, _request_timeout: float) -> Any:
        self.reads.append(f"pv {name}")
        handle, namespace, claim, uid = self.pvs[name]
        return SimpleNamespace(spec=SimpleNamespace(csi=SimpleNamespace(volume_handle=handle),
                                                    claim_ref=SimpleNamespace(namespace=namespace, name=claim, uid=uid)))

    def read_namespaced_persistent_volume_claim(self, name: str, namespace: str, _request_timeout: float) -> Any:
        self.reads.append(f"pvc {namespace}/{name}")
        if (namespace, name) not in self.claims:
            raise NotFoundError()
        uid, last_run = self.claims[(namespace, name)]
        return SimpleNamespace(metadata=SimpleNamespace(
            uid=uid, annotations={"reclaimspace.cephcsi.ceph.io/last-run": last_run.strftime("%Y-%m-%dT%H:%M:%SZ")}))


class NotFoundError(Exception):
    status = 404


def test_the_claim_of_a_staged_volume_is_read_without_its_pv_after_the_first_pass(
        kubelet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vol = staged(kubelet, "a", "vol-a")
    table = [entry(vol.mount_path), entry("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-111/mount")]
    monkeypatch.setattr(mounts, "read_mounts", lambda path=mounts.MOUNTINFO: table)
    api = FakeCoreApi()
    reader = reclaim_claims.KubeTrimRequests()
    reader._api = api  # type: ignore[assignment]
    assert reader([vol]) == {"vol-a": RUN_1}
    assert reader([vol]) == {"vol-a": RUN_1}
    assert api.reads == ["pv pvc-111", "pvc ns/data", "pvc ns/data"]  # one GET per pass once known

    api.claims[("ns", "data")] = ("uid-2", RUN_2)  # the claim deleted and made again under its name
    assert reader([vol]) == {} and "vol-a" not in reader.claims
    api.pvs["pvc-111"] = ("vol-a", "ns", "data", "uid-2")  # ... and the PV bound to the new one
    assert reader([vol]) == {"vol-a": RUN_2}

    del api.claims[("ns", "data")]  # gone: the PV is read again next time
    api.reads.clear()
    assert reader([vol]) == {} and "vol-a" not in reader.claims
    assert reader([]) == {} and reader.claims == {}  # nothing staged: nothing kept


@pytest.mark.parametrize(("argv", "seconds"), [
    (["--mode=node", "--nodeid=n"], 600.0),
    (["--mode=controller"], 60.0),
    (["--mode=all", "--nodeid=n"], 60.0),
    (["--mode=node", "--nodeid=n", "--reclaimspace-poll-interval=2m"], 120.0),
    (["--mode=node", "--nodeid=n", "--reclaimspace-poll-interval=0"], 0.0),
])
def test_the_node_pass_polls_less_often_by_default(argv: list[str], seconds: float) -> None:
    assert parse_settings(argv).sidecars.reclaimspace_poll_interval == seconds
