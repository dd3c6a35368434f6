"""The start-up sweep of stale stages (cephcsi.node.stale_stages) and the staging paths it reads
(cephcsi.node.staged_volumes): which of this driver's staged volumes it unstages (those the
Node's status neither lists as attached nor in use), that it keeps what it cannot read or
unstage, and that another driver's volumes are never its. Stage records are real files in a
temporary kubelet directory; the Node and the unstage are fakes (the real ones run in
tests/integration/node/test_stale_stages.py)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cephcsi.errors import FailedPrecondition, Unavailable
from cephcsi.node import stage_record
from cephcsi.node.stale_stages import StaleStageSweep, unique_name
from cephcsi.node.staged_volumes import staging_paths

pytestmark = pytest.mark.unit

DRIVER = "rbd.csi.ceph.com"
CSI = "plugins/kubernetes.io/csi"


def record_at(staging: Path, volume_id: str, access: str = stage_record.ACCESS_MOUNT) -> None:
    staging.mkdir(parents=True)
    stage_record.save(stage_record.StageRecord(
        volume_id=volume_id, staging_path=str(staging), cluster_id="c", pool="p", image=f"img-{volume_id}",
        namespace="", mapper="krbd", access_type=access, fs_type="ext4", device="/dev/rbd0", staged=True))


def vol_data(folder: Path, driver: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vol_data.json").write_text(json.dumps({"driverName": driver, "volumeHandle": "x"}))


@pytest.fixture
def kubelet(tmp_path: Path) -> Path:
    root = tmp_path / "kubelet"
    record_at(root / CSI / DRIVER / "sha-a" / "globalmount", "vol-a")
    record_at(root / CSI / DRIVER / "sha-b" / "globalmount", "vol-b")
    # Before Kubernetes 1.24: pv/<name>/globalmount, the driver named in vol_data.json beside it.
    record_at(root / CSI / "pv" / "pv-c" / "globalmount", "vol-c")
    vol_data(root / CSI / "pv" / "pv-c", DRIVER)
    # Block: volumeDevices/staging/<pv>, the driver in volumeDevices/<pv>/data/vol_data.json.
    record_at(root / CSI / "volumeDevices" / "staging" / "pv-d", "vol-d", stage_record.ACCESS_BLOCK)
    vol_data(root / CSI / "volumeDevices" / "pv-d" / "data", DRIVER)
    # Another driver's volumes (another cephcsi instance, another name): never this driver's.
    record_at(root / CSI / "other.csi.example.com" / "sha-e" / "globalmount", "vol-e")
    record_at(root / CSI / "pv" / "pv-f" / "globalmount", "vol-f")
    vol_data(root / CSI / "pv" / "pv-f", "other.csi.example.com")
    record_at(root / CSI / "volumeDevices" / "staging" / "pv-g", "vol-g", stage_record.ACCESS_BLOCK)
    vol_data(root / CSI / "volumeDevices" / "pv-g" / "data", "other.csi.example.com")
    return root


def node_status(attached: list[str], in_use: list[str]) -> dict[str, Any]:
    return {"status": {"volumesAttached": [{"name": unique_name(DRIVER, v), "devicePath": ""} for v in attached],
                       "volumesInUse": [unique_name(DRIVER, v) for v in in_use]}}


class Calls:
    def __init__(self, node: Mapping[str, Any] | Exception, refuse: frozenset[str] = frozenset()) -> None:
        self.node = node
        self.refuse = refuse
        self.read: list[str] = []
        self.unstaged: list[tuple[str, str]] = []

    def read_node(self, name: str) -> Mapping[str, Any]:
        self.read.append(name)
        if isinstance(self.node, Exception):
            raise self.node
        return self.node

    def unstage(self, volume_id: str, staging_path: str) -> None:
        if volume_id in self.refuse:
            raise FailedPrecondition(f"volume {volume_id} is still published at /pods/x; unpublish it there first")
        self.unstaged.append((volume_id, staging_path))


def sweep(kubelet: Path, calls: Calls) -> StaleStageSweep:
    return StaleStageSweep("node-1", DRIVER, str(kubelet), calls.read_node, calls.unstage)


def test_staging_paths_of_this_driver_only(kubelet: Path) -> None:
    found = [p.removeprefix(f"{kubelet}/{CSI}/") for p in staging_paths(str(kubelet), DRIVER, block=True)]
    assert sorted(found) == sorted([f"{DRIVER}/sha-a/globalmount", f"{DRIVER}/sha-b/globalmount",
                                    "pv/pv-c/globalmount", "volumeDevices/staging/pv-d"])
    assert "volumeDevices/staging/pv-d" not in [
        p.removeprefix(f"{kubelet}/{CSI}/") for p in staging_paths(str(kubelet), DRIVER)]


def test_volumes_neither_attached_nor_in_use_are_unstaged(kubelet: Path) -> None:
    calls = Calls(node_status(attached=["vol-a"], in_use=["vol-c"]))
    report = sweep(kubelet, calls).run()
    assert calls.read == ["node-1"]
    assert sorted(v for v, _ in calls.unstaged) == ["vol-b", "vol-d"]
    assert dict(calls.unstaged)["vol-d"] == f"{kubelet}/{CSI}/volumeDevices/staging/pv-d"
    assert sorted(report.unstaged) == ["vol-b", "vol-d"] and sorted(report.kept) == ["vol-a", "vol-c"]


def test_everything_kubernetes_lists_is_kept(kubelet: Path) -> None:
    calls = Calls(node_status(attached=["vol-a", "vol-b", "vol-d"], in_use=["vol-c"]))
    assert sweep(kubelet, calls).run().unstaged == []
    assert calls.unstaged == []


def test_another_drivers_listing_does_not_count(kubelet: Path) -> None:
    node = node_status(attached=[], in_use=[])
    node["status"]["volumesAttached"] = [{"name": f"kubernetes.io/csi/other.csi.example.com^vol-{v}"} for v in "abcd"]
    calls = Calls(node)
    assert sorted(sweep(kubelet, calls).run().unstaged) == ["vol-a", "vol-b", "vol-c", "vol-d"]


def test_a_volume_unstage_refuses_is_left_and_the_rest_go_on(kubelet: Path) -> None:
    calls = Calls(node_status(attached=[], in_use=[]), refuse=frozenset({"vol-a"}))
    report = sweep(kubelet, calls).run()
    assert report.failed == ["vol-a"]
    assert sorted(report.unstaged) == ["vol-b", "vol-c", "vol-d"]


def test_nothing_is_done_when_the_node_cannot_be_read(kubelet: Path) -> None:
    calls = Calls(Unavailable("cannot read this node's attached volumes: the API server is unreachable"))
    report = sweep(kubelet, calls).run()
    assert calls.unstaged == [] and report.unstaged == [] and report.failed == []


def test_no_stage_no_api_call(tmp_path: Path) -> None:
    calls = Calls(node_status(attached=[], in_use=[]))
    assert sweep(tmp_path / "kubelet", calls).run().unstaged == []
    assert calls.read == []


def test_an_unreadable_record_is_left_alone(kubelet: Path) -> None:
    (kubelet / CSI / DRIVER / "sha-b" / "globalmount" / stage_record.RECORD_NAME).write_text("{not json")
    calls = Calls(node_status(attached=[], in_use=[]))
    assert "vol-b" not in sweep(kubelet, calls).run().unstaged
