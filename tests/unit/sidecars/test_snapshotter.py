"""The embedded snapshotter's pure rules (csi-snapshotter's) and the provisioner's data sources."""
from __future__ import annotations

import copy
import logging
import threading
import time
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.errors import InvalidArgument
from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.sidecars.provisioner import claims, datasource
from cephcsi.sidecars.snapshotter import content as c
from cephcsi.sidecars.snapshotter.loop import SnapshotterLoop
from tests.unit.sidecars.fixtures import FakeContents

pytestmark = pytest.mark.unit


def _content(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "snapcontent-1", "annotations": {}},
            "spec": {"driver": "rbd.csi.ceph.com", "deletionPolicy": "Delete",
                     "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u-1"}, **spec}}


def test_should_delete_only_when_the_snapshot_controller_asks() -> None:
    dynamic = _content(source={"volumeHandle": "v"})
    assert not c.should_delete(dynamic)
    dynamic["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not c.should_delete(dynamic), "deleting, but not asked (no being-deleted annotation)"
    dynamic["metadata"]["annotations"][c.BEING_DELETED] = "yes"
    assert c.should_delete(dynamic)
    unbound = _content(source={"snapshotHandle": "s"}, volumeSnapshotRef={"name": "x", "namespace": "ns"})
    unbound["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert c.should_delete(unbound), "an unbound pre-provisioned content is deleted at once"


def test_names_templates_and_parameters() -> None:
    content = _content(source={"volumeHandle": "v"})
    assert c.snapshot_name(content) == "snapshot-u-1"
    assert c.resolve_template("${volumesnapshot.namespace}-${volumesnapshot.name}-${volumesnapshotcontent.name}",
                              content) == "ns-snap-snapcontent-1"
    with pytest.raises(InvalidArgument, match="unknown template"):
        c.resolve_template("${pvc.name}", content)
    params = c.create_parameters({"clusterID": "x", c.SECRET_NAME: "s"}, content, extra=True)
    assert params == {"clusterID": "x", c.META_NAME: "snap", c.META_NAMESPACE: "ns", c.META_CONTENT: "snapcontent-1"}
    with pytest.raises(InvalidArgument, match="not bound"):
        c.snapshot_name(_content(volumeSnapshotRef={}))


def test_status_of_a_snapshot() -> None:
    snapshot = csi_pb2.Snapshot(snapshot_id="id", source_volume_id="v", size_bytes=8 << 20, ready_to_use=True)
    snapshot.creation_time.seconds, snapshot.creation_time.nanos = 2, 5
    assert c.status_of(snapshot) == {"snapshotHandle": "id", "creationTime": 2_000_000_005, "restoreSize": 8 << 20,
                                     "readyToUse": True, "error": None}
    assert set(c.error_status("boom")["error"]) == {"time", "message"}


@pytest.mark.parametrize(("source", "supported"), [
    ({"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "s"}, True),
    ({"kind": "PersistentVolumeClaim", "name": "p"}, True),
    ({"kind": "VolumeSnapshot", "apiGroup": "other.io", "name": "s"}, False),
    ({"kind": "Populator", "apiGroup": "example.com", "name": "x"}, False),
])
def test_claim_data_sources(source: dict[str, str], supported: bool) -> None:
    assert (datasource.unsupported(source) is None) == supported
    claim = {"metadata": {"name": "c", "namespace": "ns", "uid": "u",
                          "annotations": {"volume.kubernetes.io/storage-provisioner": "rbd.csi.ceph.com"}},
             "spec": {"dataSource": source, "storageClassName": "sc", "accessModes": ["ReadWriteOnce"]}}
    decision = claims.decide(claim, {"metadata": {"name": "sc"}, "provisioner": "rbd.csi.ceph.com"}, False,
                             "rbd.csi.ceph.com")
    assert (decision.action is claims.Action.PROVISION) == supported, decision.reason


class _Discovery:
    def __init__(self) -> None:
        self.installed = False
        self.calls = 0

    def served(self) -> bool:
        self.calls += 1
        return self.installed


def test_snapshotter_idles_without_the_crds_and_starts_when_they_appear(caplog: pytest.LogCaptureFixture) -> None:
    contents, discovery = FakeContents(), _Discovery()
    ctx = c.SnapshotterContext(driver_name="rbd.csi.ceph.com", contents=contents, snapshots=discovery,  # type: ignore[arg-type]
                               api=None, events=None, controller=None, calls=None)  # type: ignore[arg-type]
    loop = SnapshotterLoop(ctx, workers=1, backoff=ItemBackoffSettings(0.01, 0.1), discovery_interval=0.05)
    for _term in range(2):
        stop = threading.Event()
        asked = discovery.calls
        with caplog.at_level(logging.WARNING, logger="cephcsi.sidecars.snapshotter.loop"):
            loop.start(stop)
            deadline = time.monotonic() + 10
            while discovery.calls < asked + 2:  # discovery asked (and answered "no") twice
                assert time.monotonic() < deadline
                time.sleep(0.005)
        assert not contents.started.is_set(), "no informer (and no list retries) without the CRDs"
        began = time.monotonic()
        stop.set()
        assert loop.stop(timeout=60.0)
        assert time.monotonic() - began < 30, "stop never waits for the CRDs"
    assert [r.getMessage() for r in caplog.records].count(
        "snapshot CRDs not installed; snapshotter idle until they are "
        "(kubernetes-csi/external-snapshotter client/config/crd)") == 1
    assert discovery.calls >= 2, "discovery is asked again"
    discovery.installed = True
    stop = threading.Event()
    loop.start(stop)
    assert contents.started.wait(2.0)
    deadline = time.monotonic() + 2.0
    while loop._pool is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop._pool is not None, "workers start once the CRDs are served"
    stop.set()
    assert loop.stop(timeout=5.0)


def test_only_the_workers_own_failure_bookkeeping_does_not_requeue() -> None:
    base: dict[str, Any] = {"metadata": {"name": "c", "resourceVersion": "1", "annotations": {"keep": "x"}},
                            "spec": {"driver": "d", "deletionPolicy": "Delete"}, "status": {"readyToUse": False}}
    marked = copy.deepcopy(base)
    marked["metadata"]["resourceVersion"] = "2"
    marked["metadata"]["annotations"][c.BEING_CREATED] = "yes"
    marked["status"]["error"] = {"time": "t", "message": "m"}
    assert c.only_own_bookkeeping(base, marked) and c.only_own_bookkeeping(marked, base)
    for change in ({"spec": {"driver": "d", "deletionPolicy": "Retain"}},
                   {"status": {"readyToUse": True}},
                   {"metadata": {"name": "c", "annotations": {"keep": "y"}}},
                   {"metadata": {"name": "c", "annotations": {"keep": "x"}, "deletionTimestamp": "now"}}):
        other = {**copy.deepcopy(base), **change}
        assert not c.only_own_bookkeeping(base, other), change
