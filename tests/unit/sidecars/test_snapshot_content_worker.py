"""The snapshotter's ContentWorker against fakes: create failures, not-ready snapshots retried
through the work queue, deletion policies and pre-provisioned contents."""
from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from cephcsi import errors
from cephcsi._generated import csi_pb2
from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.snapshotter import content as c
from cephcsi.sidecars.snapshotter.loop import SnapshotterLoop
from tests.unit.sidecars.fixtures import DRIVER, FAKE_KEY, FakeApi, FakeContents, FakeEvents

pytestmark = pytest.mark.unit

SECRET = {"userID": "u", "userKey": FAKE_KEY}
CLASS = {"driver": DRIVER, "parameters": {
    "clusterID": "c1", c.SECRET_NAME: "snap-${volumesnapshot.name}", c.SECRET_NAMESPACE: "${volumesnapshot.namespace}"}}
HANDLE = "0001-0002-c1-0000000000000001-5f7c624a-9376-45f8-ac8d-515bd2d7ec44"
Outcome = errors.CephCSIError | bool


def content(name: str = "snapcontent-1", *, policy: str = "Delete", deleting: bool = False,
            annotations: dict[str, str] | None = None, status: dict[str, Any] | None = None,
            finalizers: tuple[str, ...] = (c.BOUND_FINALIZER,), **spec: Any) -> dict[str, Any]:
    """A dynamic content of VolumeSnapshot ns/snap unless `source` says otherwise."""
    meta: dict[str, Any] = {"name": name, "resourceVersion": "1", "annotations": dict(annotations or {}),
                            "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    body = {"driver": DRIVER, "deletionPolicy": policy, "volumeSnapshotClassName": "rbd",
            "source": {"volumeHandle": "vol-1"}, "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "u-1"}}
    return {"metadata": meta, "spec": {**body, **spec}, **({"status": status} if status is not None else {})}


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """JSON merge patch (RFC 7386): null removes a key, objects merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeSnapshotApi:
    """VolumeSnapshotContent writes as the apiserver answers them: merge patches applied to the
    informer's cache, the resourceVersion bumped by a change, a patch naming an older
    resourceVersion refused (a conflict: ABORTED, as cephcsi.sidecars.kubeerrors maps it)."""

    def __init__(self, contents: FakeContents, classes: dict[str, dict[str, Any]] | None = None) -> None:
        self.contents = contents
        self.classes = {"rbd": CLASS} if classes is None else classes
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def served(self) -> bool:
        return True

    def get_class(self, name: str) -> dict[str, Any] | None:
        return self.classes.get(name)

    def patch_content(self, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        return self._write("patch", name, patch)

    def patch_content_status(self, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        return self._write("status", name, {"status": status})

    def _write(self, kind: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        with self.lock:
            old = self.contents.get(name)
            if old is None:
                return None
            new, patch = copy.deepcopy(old), copy.deepcopy(patch)
            expected = (patch.get("metadata") or {}).pop("resourceVersion", None)
            if expected is not None and expected != old["metadata"]["resourceVersion"]:
                raise errors.OperationInFlight(f'patch VolumeSnapshotContent "{name}": the object has been modified')
            self.writes.append((kind, patch))
            merge(new, patch)
            if new == old:
                return new  # a no-op write changes nothing and sends no watch event
            new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 1)
        self.contents.changed(old, new)
        return copy.deepcopy(new)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.writes]


class FakeSnapshotController:
    """CreateSnapshot answers the next of `outcomes` (an error to raise or the readiness to
    report; the last one repeats); ListSnapshots knows `existing`; DeleteSnapshot may fail."""

    def __init__(self, *outcomes: Outcome, existing: dict[str, bool] | None = None) -> None:
        self.outcomes = list(outcomes) or [True]
        self.existing = existing or {}
        self.created: list[csi_pb2.CreateSnapshotRequest] = []
        self.listed: list[csi_pb2.ListSnapshotsRequest] = []
        self.deleted: list[csi_pb2.DeleteSnapshotRequest] = []
        self.delete_error: errors.CephCSIError | None = None

    @staticmethod
    def snapshot(snapshot_id: str, ready: bool) -> csi_pb2.Snapshot:
        made = csi_pb2.Snapshot(snapshot_id=snapshot_id, source_volume_id="vol-1", size_bytes=16 << 20, ready_to_use=ready)
        made.creation_time.seconds = 1_700_000_000
        return made

    def CreateSnapshot(self, request: csi_pb2.CreateSnapshotRequest, context: object) -> csi_pb2.CreateSnapshotResponse:  # noqa: N802
        self.created.append(request)
        outcome = self.outcomes[min(len(self.created), len(self.outcomes)) - 1]
        if isinstance(outcome, errors.CephCSIError):
            raise outcome
        return csi_pb2.CreateSnapshotResponse(snapshot=self.snapshot(HANDLE, outcome))

    def ListSnapshots(self, request: csi_pb2.ListSnapshotsRequest, context: object) -> csi_pb2.ListSnapshotsResponse:  # noqa: N802
        self.listed.append(request)
        found = [csi_pb2.ListSnapshotsResponse.Entry(snapshot=self.snapshot(request.snapshot_id, ready))
                 for snapshot_id, ready in self.existing.items() if snapshot_id == request.snapshot_id]
        return csi_pb2.ListSnapshotsResponse(entries=found)

    def DeleteSnapshot(self, request: csi_pb2.DeleteSnapshotRequest, context: object) -> csi_pb2.DeleteSnapshotResponse:  # noqa: N802
        self.deleted.append(request)
        if self.delete_error is not None:
            raise self.delete_error
        return csi_pb2.DeleteSnapshotResponse()


class Setup:
    def __init__(self, *items: dict[str, Any], controller: FakeSnapshotController | None = None,
                 classes: dict[str, dict[str, Any]] | None = None) -> None:
        self.contents = FakeContents(*items)
        self.api = FakeSnapshotApi(self.contents, classes)
        self.kube = FakeApi(secrets={("ns", "snap-snap"): SECRET, ("sys", "list"): {"userID": "lister", "userKey": FAKE_KEY},
                                     ("sys", "deleter"): {"userID": "deleter", "userKey": FAKE_KEY}})
        self.events = FakeEvents()
        self.controller = controller or FakeSnapshotController()
        self.calls = CsiCalls(max_workers=2, timeout=5.0)
        self.ctx = c.SnapshotterContext(driver_name=DRIVER, contents=self.contents, snapshots=self.api,  # type: ignore[arg-type]
                                        api=self.kube, events=self.events,  # type: ignore[arg-type]
                                        controller=self.controller, calls=self.calls)  # type: ignore[arg-type]
        self.worker = c.ContentWorker(self.ctx, threading.Event())

    def now(self, name: str = "snapcontent-1") -> dict[str, Any]:
        found = self.contents.get(name)
        assert found is not None
        return found

    def warnings(self) -> list[str]:
        return [r[2] for r in self.events.recorded if r[1] == "Warning"]

    def run_loop(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        """The leader loop with its real work queue (1-20 ms backoff) until `done`."""
        loop = SnapshotterLoop(self.ctx, workers=1, backoff=ItemBackoffSettings(0.001, 0.02), discovery_interval=0.01)
        stop = threading.Event()
        loop.start(stop)
        deadline = time.monotonic() + timeout
        try:
            while not done():
                assert time.monotonic() < deadline, (self.now(), self.events.recorded)
                time.sleep(0.005)
        finally:
            stop.set()
            assert loop.stop(timeout=5.0)


# ---- CreateSnapshot failures -------------------------------------------------------------------


def test_a_failed_create_sets_the_error_and_a_warning_and_keeps_being_created() -> None:
    s = Setup(content(), controller=FakeSnapshotController(errors.Unavailable("mon unreachable")))
    with pytest.raises(errors.Unavailable):
        s.worker.process("snapcontent-1")
    (request,) = s.controller.created
    assert (request.name, request.source_volume_id, dict(request.parameters)) == ("snapshot-u-1", "vol-1", {"clusterID": "c1"})
    assert dict(request.secrets) == SECRET, "the class's secret templates, resolved for this VolumeSnapshot"
    now = s.now()
    assert now["status"]["error"]["message"] == "mon unreachable" and now["status"]["error"]["time"].endswith("Z")
    assert s.events.recorded == [("snapcontent-1", "Warning", "SnapshotCreationFailed", "mon unreachable")]
    # UNAVAILABLE may still have cut the snapshot: the snapshot-controller must keep waiting.
    assert c.BEING_CREATED in now["metadata"]["annotations"]
    assert "readyToUse" not in now["status"]


def test_a_final_create_failure_releases_being_created_at_once() -> None:
    s = Setup(content(), controller=FakeSnapshotController(errors.InvalidArgument("unknown snapshot parameter(s) x")))
    with pytest.raises(errors.InvalidArgument):
        s.worker.process("snapcontent-1")
    # Set and dropped in the same pass: a final error means nothing is being cut.
    assert c.BEING_CREATED not in s.now()["metadata"]["annotations"]
    assert s.warnings() == ["SnapshotCreationFailed"]


def test_a_missing_class_fails_before_any_csi_call() -> None:
    s = Setup(content(), classes={})
    with pytest.raises(errors.InvalidArgument, match='volumesnapshotclass.snapshot.storage.k8s.io "rbd" not found'):
        s.worker.process("snapcontent-1")
    assert not s.controller.created and s.warnings() == ["SnapshotCreationFailed"]
    assert c.BEING_CREATED not in s.now()["metadata"]["annotations"]


@pytest.mark.parametrize("lost", ["class", "secret"])
def test_a_create_whose_input_is_gone_keeps_the_being_created_of_an_earlier_attempt(lost: str) -> None:
    # An earlier CreateSnapshot timed out (the snapshot may be cut) and then the class or the
    # secret went: no answer of the driver, so the snapshot-controller must keep waiting.
    s = Setup(content(annotations={c.BEING_CREATED: "yes"}), classes={} if lost == "class" else None)
    if lost == "secret":
        del s.kube.secrets[("ns", "snap-snap")]
    with pytest.raises(errors.CephCSIError) as raised:
        s.worker.process("snapcontent-1")
    now = s.now()
    assert c.BEING_CREATED in now["metadata"]["annotations"] and not s.controller.created
    assert now["status"]["error"]["message"] == raised.value.message and s.warnings() == ["SnapshotCreationFailed"]


def test_the_same_error_is_not_written_again() -> None:
    s = Setup(content(), controller=FakeSnapshotController(errors.Unavailable("mon unreachable")))
    for _attempt in range(3):
        with pytest.raises(errors.Unavailable):
            s.worker.process("snapcontent-1")
    assert s.api.kinds().count("status") == 1, "a rewrite would only move its time and re-queue the content"
    assert s.warnings() == ["SnapshotCreationFailed"] * 3, "each failed attempt is still an event"


def test_a_failed_create_is_retried_through_the_queue_until_it_succeeds() -> None:
    controller = FakeSnapshotController(errors.Unavailable("mon unreachable"), errors.DeadlineExceeded("slow"), True)
    s = Setup(content(), controller=controller)
    s.run_loop(lambda: bool((s.now().get("status") or {}).get("readyToUse")))
    assert len(controller.created) == 3 and {r.name for r in controller.created} == {"snapshot-u-1"}, \
        "retried with the same name (CreateSnapshot is idempotent by name)"
    status = s.now()["status"]
    assert "error" not in status, "success clears the error"
    assert (status["snapshotHandle"], status["restoreSize"], status["creationTime"]) == (HANDLE, 16 << 20, 1_700_000_000 * 10**9)
    assert c.BEING_CREATED not in s.now()["metadata"]["annotations"]
    assert s.events.reasons() == ["SnapshotCreationFailed", "SnapshotCreationFailed", "SnapshotCreated"]


def test_a_snapshot_not_ready_is_requeued_until_it_is() -> None:
    controller = FakeSnapshotController(False, False, True)
    s = Setup(content(), controller=controller)
    s.run_loop(lambda: (s.now().get("status") or {}).get("readyToUse") is True)
    assert len(controller.created) == 3
    assert s.events.reasons() == ["SnapshotCreated"], "not ready yet is no failure: no warning, no error"
    assert [w for w in s.api.writes if w[0] == "status"][0][1]["status"]["readyToUse"] is False, \
        "the handle is published before it is ready"
    assert c.BEING_CREATED not in s.now()["metadata"]["annotations"]


def test_a_not_ready_answer_drops_being_created_and_is_not_set_again_while_checking() -> None:
    s = Setup(content(), controller=FakeSnapshotController(False))
    with pytest.raises(c.NotReady):
        s.worker.process("snapcontent-1")
    now = s.now()
    assert now["status"]["snapshotHandle"] == HANDLE and now["status"]["readyToUse"] is False
    assert c.BEING_CREATED not in now["metadata"]["annotations"], "answered: the handle is known"
    assert not s.events.recorded
    writes = len(s.api.writes)
    with pytest.raises(c.NotReady):
        s.worker.process("snapcontent-1")
    assert c.BEING_CREATED not in s.now()["metadata"]["annotations"]
    assert not [w for w in s.api.writes[writes:] if w[0] != "status"], "no annotation churn per check"


def test_a_deleted_content_whose_snapshot_is_not_ready_is_deleted_without_waiting() -> None:
    """A flatten pending must not hold the deletion: the handle is known."""
    s = Setup(content(deleting=True, annotations={c.BEING_DELETED: "yes", c.DELETION_SECRET_NAME: "deleter",
                                                   c.DELETION_SECRET_NAMESPACE: "sys"},
                      status={"snapshotHandle": HANDLE, "readyToUse": False}))
    s.worker.process("snapcontent-1")
    assert not s.controller.created
    (deleted,) = s.controller.deleted
    assert deleted.snapshot_id == HANDLE and s.now()["metadata"]["finalizers"] == []


# ---- deletion ---------------------------------------------------------------------------------


def _deleting(policy: str, **kw: Any) -> dict[str, Any]:
    annotations = {c.BEING_DELETED: "yes", c.DELETION_SECRET_NAME: "deleter", c.DELETION_SECRET_NAMESPACE: "sys"}
    return content(policy=policy, deleting=True, annotations=annotations, finalizers=(c.BOUND_FINALIZER, "example.com/keep"),
                   status={"snapshotHandle": HANDLE, "readyToUse": True}, **kw)


def test_retain_keeps_the_snapshot_and_releases_the_content() -> None:
    s = Setup(_deleting("Retain"))
    s.worker.process("snapcontent-1")
    assert not s.controller.deleted
    now = s.now()
    assert now["metadata"]["finalizers"] == ["example.com/keep"], "only our finalizer goes"
    assert now["status"]["snapshotHandle"] == HANDLE, "a retained snapshot keeps its handle"


def test_delete_removes_the_snapshot_then_the_finalizer_in_one_pass() -> None:
    s = Setup(_deleting("Delete"))
    s.worker.process("snapcontent-1")  # no conflict: the finalizer patch names the status write's version
    (request,) = s.controller.deleted
    assert request.snapshot_id == HANDLE and dict(request.secrets)["userID"] == "deleter"
    now = s.now()
    assert now["metadata"]["finalizers"] == ["example.com/keep"]
    assert "snapshotHandle" not in now["status"] and now["status"]["readyToUse"] is False


def test_a_failed_delete_keeps_the_finalizer_and_warns() -> None:
    s = Setup(_deleting("Delete"))
    s.controller.delete_error = errors.Unavailable("mon unreachable")
    with pytest.raises(errors.Unavailable):
        s.worker.process("snapcontent-1")
    assert s.now()["metadata"]["finalizers"] == [c.BOUND_FINALIZER, "example.com/keep"]
    assert s.warnings() == ["SnapshotDeleteError"]


def test_a_deleting_content_waits_for_the_snapshot_controller() -> None:
    item = content(deleting=True, status={"snapshotHandle": HANDLE, "readyToUse": True})
    s = Setup(item)
    s.worker.process("snapcontent-1")
    assert not s.controller.deleted and not s.api.writes, "no being-deleted annotation: not asked yet"


def _deleting_unanswered(**kw: Any) -> dict[str, Any]:
    """Deleted while its CreateSnapshot was never answered: being-created kept, no handle."""
    annotations = {c.BEING_DELETED: "yes", c.BEING_CREATED: "yes", c.DELETION_SECRET_NAME: "deleter",
                   c.DELETION_SECRET_NAMESPACE: "sys"}
    return content(deleting=True, annotations=annotations, **kw)


def test_a_deleted_content_with_an_unanswered_create_asks_again_then_deletes_in_the_same_pass() -> None:
    s = Setup(_deleting_unanswered())
    s.worker.process("snapcontent-1")
    (created,) = s.controller.created
    assert created.name == "snapshot-u-1", "asked again under the same name (idempotent)"
    (deleted,) = s.controller.deleted
    assert deleted.snapshot_id == HANDLE, "the snapshot the unanswered create made is deleted, not leaked"
    assert s.now()["metadata"]["finalizers"] == []


def test_a_deleted_content_whose_create_stays_unanswered_keeps_its_finalizer() -> None:
    s = Setup(_deleting_unanswered(), controller=FakeSnapshotController(errors.DeadlineExceeded("slow")))
    with pytest.raises(errors.DeadlineExceeded):
        s.worker.process("snapcontent-1")
    assert not s.controller.deleted
    now = s.now()
    assert now["metadata"]["finalizers"] == [c.BOUND_FINALIZER]
    assert c.BEING_CREATED in now["metadata"]["annotations"], "no handle known yet: nothing may be released"


def test_a_deleted_content_left_ready_by_a_crash_is_deleted_in_the_same_pass() -> None:
    s = Setup(_deleting_unanswered(status={"snapshotHandle": HANDLE, "readyToUse": True}))
    s.worker.process("snapcontent-1")
    assert not s.controller.created
    (deleted,) = s.controller.deleted
    assert deleted.snapshot_id == HANDLE and s.now()["metadata"]["finalizers"] == []


def test_a_deletion_waits_for_a_create_still_running_in_the_background() -> None:
    s = Setup(_deleting("Delete"))
    release = threading.Event()
    running = threading.Thread(target=lambda: s.calls.run("CreateSnapshot", "snapshot-u-1", release.wait, None))
    running.start()
    try:
        deadline = time.monotonic() + 5
        while not s.calls.busy("snapshot-u-1"):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(errors.OperationInFlight):
            s.worker.process("snapcontent-1")
        assert not s.controller.deleted and c.BOUND_FINALIZER in s.now()["metadata"]["finalizers"]
    finally:
        release.set()
        running.join()
    s.worker.process("snapcontent-1")
    assert len(s.controller.deleted) == 1 and s.now()["metadata"]["finalizers"] == ["example.com/keep"]


def test_a_deleted_content_answered_but_not_ready_is_deleted_without_its_class() -> None:
    """A crash between the status write and the annotation's removal, then the class went."""
    s = Setup(_deleting_unanswered(status={"snapshotHandle": HANDLE, "readyToUse": False}), classes={})
    s.worker.process("snapcontent-1")
    assert not s.controller.created
    (deleted,) = s.controller.deleted
    assert deleted.snapshot_id == HANDLE and s.now()["metadata"]["finalizers"] == []


def test_should_delete_waits_for_an_unanswered_create() -> None:
    assert not c.should_delete(_deleting_unanswered())
    assert c.should_delete(_deleting("Delete"))


# ---- pre-provisioned (static) contents --------------------------------------------------------


def _static(ready: bool = True, **kw: Any) -> tuple[Setup, dict[str, Any]]:
    classes = {"rbd": {"driver": DRIVER, "parameters": {c.LIST_SECRET_NAME: "list", c.LIST_SECRET_NAMESPACE: "sys"}}}
    item = content(source={"snapshotHandle": HANDLE}, **kw)
    return Setup(item, controller=FakeSnapshotController(existing={HANDLE: ready}), classes=classes), item


def test_a_static_content_is_imported_with_the_list_secret() -> None:
    s, _ = _static()
    s.worker.process("snapcontent-1")
    assert not s.controller.created, "a pre-provisioned snapshot is never created"
    (request,) = s.controller.listed
    assert request.snapshot_id == HANDLE and dict(request.secrets)["userID"] == "lister"
    now = s.now()
    assert now["status"]["snapshotHandle"] == HANDLE and now["status"]["readyToUse"] is True
    assert c.BEING_CREATED not in now["metadata"]["annotations"] and not s.events.recorded


def test_a_static_content_not_ready_is_checked_again() -> None:
    s, _ = _static(ready=False)
    with pytest.raises(c.NotReady):
        s.worker.process("snapcontent-1")
    assert s.now()["status"]["readyToUse"] is False and not s.events.recorded


def test_a_static_content_naming_no_snapshot_fails_with_a_warning() -> None:
    s, _ = _static()
    s.controller.existing = {}
    with pytest.raises(errors.InvalidArgument, match="does not exist"):
        s.worker.process("snapcontent-1")
    assert s.warnings() == ["SnapshotContentCheckandUpdateFailed"]
    assert "does not exist" in s.now()["status"]["error"]["message"]


def test_an_unbound_static_content_is_deleted_at_once() -> None:
    s, _ = _static(deleting=True, volumeSnapshotRef={"name": "snap", "namespace": "ns"})
    s.worker.process("snapcontent-1")  # no being-deleted annotation: nothing binds it
    assert [r.snapshot_id for r in s.controller.deleted] == [HANDLE]
    assert s.now()["metadata"]["finalizers"] == []
