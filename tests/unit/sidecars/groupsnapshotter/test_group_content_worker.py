"""The group snapshotter's worker against fakes (create, failures, deletion policies,
pre-provisioned contents), its loop's "CRDs not installed" notice, and the snapshotter's handling
of the member VolumeSnapshotContents the snapshot-controller makes for a group."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc
import pytest

from cephcsi import errors
from cephcsi._generated import csi_pb2
from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.groupsnapshotter import content as g
from cephcsi.sidecars.groupsnapshotter.loop import GroupSnapshotterLoop
from cephcsi.sidecars.snapshotter import content as c
from tests.unit.sidecars.fixtures import DRIVER, FAKE_KEY, FakeApi, FakeContents, FakeEvents
from tests.unit.sidecars.test_snapshot_content_worker import FakeSnapshotApi, FakeSnapshotController, Setup
from tests.unit.sidecars.test_snapshot_content_worker import content as snapshot_content

pytestmark = pytest.mark.unit

SECRET = {"userID": "u", "userKey": FAKE_KEY}
CLASS = {"driver": DRIVER, "parameters": {
    "clusterID": "c1", g.SECRET_NAME: "group-${volumegroupsnapshot.name}", g.SECRET_NAMESPACE: "${volumegroupsnapshot.namespace}"}}
GROUP_HANDLE = "0001-0002-c1-0000000000000001-6a1c1c0e-0000-4000-8000-000000000001"
MEMBERS = {"vol-1": "snap-id-1", "vol-2": "snap-id-2"}
Outcome = errors.CephCSIError | bool


def group_content(name: str = "groupsnapcontent-1", *, policy: str = "Delete", deleting: bool = False,
                  annotations: dict[str, str] | None = None, status: dict[str, Any] | None = None,
                  **spec: Any) -> dict[str, Any]:
    """A dynamic content of VolumeGroupSnapshot ns/backup unless `source` says otherwise."""
    meta: dict[str, Any] = {"name": name, "resourceVersion": "1", "annotations": dict(annotations or {}),
                            "finalizers": [g.BOUND_FINALIZER]}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    body = {"driver": DRIVER, "deletionPolicy": policy, "volumeGroupSnapshotClassName": "rbd-group",
            "source": {"volumeHandles": ["vol-1", "vol-2"]},
            "volumeGroupSnapshotRef": {"name": "backup", "namespace": "ns", "uid": "g-1"}}
    return {"metadata": meta, "spec": {**body, **spec}, **({"status": status} if status is not None else {})}


def group_message(ready: bool) -> csi_pb2.VolumeGroupSnapshot:
    members = []
    for volume, snapshot_id in MEMBERS.items():
        member = csi_pb2.Snapshot(snapshot_id=snapshot_id, source_volume_id=volume, size_bytes=8 << 20, ready_to_use=ready,
                                  group_snapshot_id=GROUP_HANDLE)
        member.creation_time.seconds, member.creation_time.nanos = 1_700_000_000, 5
        members.append(member)
    group = csi_pb2.VolumeGroupSnapshot(group_snapshot_id=GROUP_HANDLE, snapshots=members, ready_to_use=ready)
    group.creation_time.seconds = 1_700_000_000
    return group


class FakeGroupController:
    def __init__(self, *outcomes: Outcome) -> None:
        self.outcomes = list(outcomes) or [True]
        self.created: list[csi_pb2.CreateVolumeGroupSnapshotRequest] = []
        self.got: list[csi_pb2.GetVolumeGroupSnapshotRequest] = []
        self.deleted: list[csi_pb2.DeleteVolumeGroupSnapshotRequest] = []

    def CreateVolumeGroupSnapshot(self, request: csi_pb2.CreateVolumeGroupSnapshotRequest,  # noqa: N802
                                  context: object) -> csi_pb2.CreateVolumeGroupSnapshotResponse:
        self.created.append(request)
        outcome = self.outcomes[min(len(self.created), len(self.outcomes)) - 1]
        if isinstance(outcome, errors.CephCSIError):
            raise outcome
        return csi_pb2.CreateVolumeGroupSnapshotResponse(group_snapshot=group_message(outcome))

    def GetVolumeGroupSnapshot(self, request: csi_pb2.GetVolumeGroupSnapshotRequest,  # noqa: N802
                               context: object) -> csi_pb2.GetVolumeGroupSnapshotResponse:
        self.got.append(request)
        return csi_pb2.GetVolumeGroupSnapshotResponse(group_snapshot=group_message(True))

    def DeleteVolumeGroupSnapshot(self, request: csi_pb2.DeleteVolumeGroupSnapshotRequest,  # noqa: N802
                                  context: object) -> csi_pb2.DeleteVolumeGroupSnapshotResponse:
        self.deleted.append(request)
        return csi_pb2.DeleteVolumeGroupSnapshotResponse()


class GroupSetup:
    def __init__(self, *items: dict[str, Any], groups: FakeGroupController | None = None) -> None:
        self.contents = FakeContents(*items)
        self.api = FakeSnapshotApi(self.contents, {"rbd-group": CLASS})
        self.kube = FakeApi(secrets={("ns", "group-backup"): SECRET, ("sys", "deleter"): {"userID": "d", "userKey": FAKE_KEY}})
        self.events = FakeEvents()
        self.groups = groups or FakeGroupController()
        self.ctx = g.GroupSnapshotterContext(
            driver_name=DRIVER, contents=self.contents, snapshots=self.api,  # type: ignore[arg-type]
            api=self.kube, events=self.events, controller=None, calls=CsiCalls(max_workers=2, timeout=5.0),  # type: ignore[arg-type]
            groups=self.groups)  # type: ignore[arg-type]
        self.worker = g.GroupContentWorker(self.ctx, threading.Event())

    def now(self, name: str = "groupsnapcontent-1") -> dict[str, Any]:
        found = self.contents.get(name)
        assert found is not None
        return found


def test_create_sends_the_volumes_class_and_secret_and_records_every_member() -> None:
    s = GroupSetup(group_content())
    s.worker.process("groupsnapcontent-1")
    (request,) = s.groups.created
    assert request.name == "groupsnapshot-g-1", "csi-snapshotter's name: <prefix>-<VolumeGroupSnapshot uid>"
    assert list(request.source_volume_ids) == ["vol-1", "vol-2"]
    assert dict(request.parameters) == {"clusterID": "c1"}, "the csi.storage.k8s.io/ keys stay out"
    assert dict(request.secrets) == SECRET, "the class's group-snapshotter secret, templates resolved"
    status = s.now()["status"]
    assert status["volumeGroupSnapshotHandle"] == GROUP_HANDLE and status["readyToUse"] is True
    assert status["creationTime"] == "2023-11-14T22:13:20Z"
    assert status["volumeSnapshotInfoList"] == [
        {"volumeHandle": v, "snapshotHandle": i, "creationTime": 1_700_000_000_000_000_005, "readyToUse": True,
         "restoreSize": 8 << 20} for v, i in MEMBERS.items()]
    assert g.BEING_CREATED not in s.now()["metadata"]["annotations"]
    assert [r[2] for r in s.events.recorded] == ["GroupSnapshotCreated"]
    s.worker.process("groupsnapcontent-1")
    assert len(s.groups.created) == 1, "a ready content is left alone"


@pytest.mark.parametrize(("error", "keeps_being_created"), [
    (errors.Unavailable("mon unreachable"), True), (errors.InvalidArgument("encrypted member refused"), False)])
def test_a_failed_create_records_the_error_and_keeps_being_created_unless_final(
        error: errors.CephCSIError, keeps_being_created: bool) -> None:
    s = GroupSetup(group_content(), groups=FakeGroupController(error))
    with pytest.raises(type(error)):
        s.worker.process("groupsnapcontent-1")
    now = s.now()
    assert now["status"]["error"]["message"] == error.message
    assert (g.BEING_CREATED in now["metadata"]["annotations"]) is keeps_being_created
    assert [r[2:] for r in s.events.recorded] == [("GroupSnapshotCreationFailed", error.message)]


def test_a_group_not_ready_yet_is_recorded_and_asked_again() -> None:
    s = GroupSetup(group_content(), groups=FakeGroupController(False, True))
    with pytest.raises(c.NotReady):
        s.worker.process("groupsnapcontent-1")
    assert s.now()["status"]["readyToUse"] is False
    assert g.BEING_CREATED not in s.now()["metadata"]["annotations"], "the group is cut: nothing can leak"
    s.worker.process("groupsnapcontent-1")
    assert s.now()["status"]["readyToUse"] is True and len(s.groups.created) == 2


def test_a_content_without_class_or_binding_is_refused_before_any_call() -> None:
    s = GroupSetup(group_content(volumeGroupSnapshotClassName=""))
    with pytest.raises(errors.InvalidArgument, match="VolumeGroupSnapshotClass"):
        s.worker.process("groupsnapcontent-1")
    s = GroupSetup(group_content(volumeGroupSnapshotRef={"name": "backup", "namespace": "ns"}))
    with pytest.raises(errors.InvalidArgument, match="not bound"):
        s.worker.process("groupsnapcontent-1")
    assert not s.groups.created and g.BEING_CREATED not in s.now()["metadata"]["annotations"]


DELETION = {g.DELETION_SECRET_NAME: "deleter", g.DELETION_SECRET_NAMESPACE: "sys"}
CUT = {"volumeGroupSnapshotHandle": GROUP_HANDLE, "readyToUse": True, "creationTime": "2023-11-14T22:13:20Z",
       "volumeSnapshotInfoList": [{"volumeHandle": v, "snapshotHandle": i} for v, i in MEMBERS.items()]}


def test_delete_policy_deletes_the_group_with_its_members_then_releases_the_finalizer() -> None:
    s = GroupSetup(group_content(deleting=True, status=dict(CUT), annotations={g.BEING_DELETED: "yes", **DELETION}))
    s.worker.process("groupsnapcontent-1")
    (request,) = s.groups.deleted
    assert (request.group_snapshot_id, list(request.snapshot_ids)) == (GROUP_HANDLE, ["snap-id-1", "snap-id-2"])
    assert dict(request.secrets) == {"userID": "d", "userKey": FAKE_KEY}
    now = s.now()
    assert "volumeGroupSnapshotHandle" not in now["status"] and now["metadata"]["finalizers"] == []


def test_no_delete_while_the_create_asked_again_is_still_unanswered() -> None:
    s = GroupSetup(group_content(deleting=True, annotations={g.BEING_DELETED: "yes", g.BEING_CREATED: "yes"}),
                   groups=FakeGroupController(errors.DeadlineExceeded("CreateVolumeGroupSnapshot timed out")))
    with pytest.raises(errors.DeadlineExceeded):
        s.worker.process("groupsnapcontent-1")
    now = s.now()
    assert len(s.groups.created) == 1 and not s.groups.deleted and now["metadata"]["finalizers"] == [g.BOUND_FINALIZER]
    assert g.BEING_CREATED in now["metadata"]["annotations"]


def test_no_delete_until_the_snapshot_controller_asks() -> None:
    s = GroupSetup(group_content(deleting=True, status=dict(CUT)))
    s.worker.process("groupsnapcontent-1")
    assert not s.groups.deleted and s.now()["metadata"]["finalizers"] == [g.BOUND_FINALIZER]


def test_a_deleted_content_with_an_unanswered_create_asks_again_then_deletes_in_the_same_pass() -> None:
    # Dropping being-created is own bookkeeping: its watch event re-queues nothing, so a second
    # pass would only come with the resync (600 s). One process() call must do both.
    s = GroupSetup(group_content(deleting=True, annotations={g.BEING_DELETED: "yes", g.BEING_CREATED: "yes", **DELETION}))
    s.worker.process("groupsnapcontent-1")
    assert len(s.groups.created) == 1, "the create is answered first"
    (request,) = s.groups.deleted
    assert request.group_snapshot_id == GROUP_HANDLE and list(request.snapshot_ids) == ["snap-id-1", "snap-id-2"]
    assert s.now()["metadata"]["finalizers"] == []


def test_a_deleted_content_left_ready_by_a_crash_is_deleted_in_the_same_pass() -> None:
    s = GroupSetup(group_content(deleting=True, status=dict(CUT),
                                 annotations={g.BEING_DELETED: "yes", g.BEING_CREATED: "yes", **DELETION}))
    s.worker.process("groupsnapcontent-1")
    assert not s.groups.created, "the status already records the group"
    (request,) = s.groups.deleted
    assert request.group_snapshot_id == GROUP_HANDLE and s.now()["metadata"]["finalizers"] == []


def test_a_deleted_content_answered_but_not_ready_is_deleted_without_its_class() -> None:
    """A crash between the status write and the annotation's removal, then the class went."""
    s = GroupSetup(group_content(deleting=True, status={**CUT, "readyToUse": False},
                                 annotations={g.BEING_DELETED: "yes", g.BEING_CREATED: "yes", **DELETION}))
    s.api.classes.clear()
    s.worker.process("groupsnapcontent-1")
    assert not s.groups.created
    (request,) = s.groups.deleted
    assert request.group_snapshot_id == GROUP_HANDLE and s.now()["metadata"]["finalizers"] == []


def test_a_deleted_content_whose_answer_is_not_ready_is_deleted_on_the_retry() -> None:
    s = GroupSetup(group_content(deleting=True, annotations={g.BEING_DELETED: "yes", g.BEING_CREATED: "yes", **DELETION}),
                   groups=FakeGroupController(False))
    with pytest.raises(c.NotReady):
        s.worker.process("groupsnapcontent-1")
    assert not s.groups.deleted and s.now()["status"]["volumeGroupSnapshotHandle"] == GROUP_HANDLE
    s.worker.process("groupsnapcontent-1")  # the backoff retry the NotReady asks for
    assert len(s.groups.deleted) == 1 and len(s.groups.created) == 1 and s.now()["metadata"]["finalizers"] == []


@pytest.mark.parametrize("lost", ["class", "secret", "binding"])
def test_a_deleted_content_whose_create_input_is_gone_keeps_being_created(lost: str) -> None:
    # The namespace went with the VolumeGroupSnapshot and its secret (or the class went) while
    # an earlier create was unanswered: the group may exist in Ceph, so the content must not be
    # released without DeleteVolumeGroupSnapshot.
    annotations = {g.BEING_DELETED: "yes", g.BEING_CREATED: "yes", **DELETION}
    ref = {"name": "backup", "namespace": "ns"} if lost == "binding" else {"name": "backup", "namespace": "ns", "uid": "g-1"}
    s = GroupSetup(group_content(deleting=True, annotations=annotations, volumeGroupSnapshotRef=ref))
    if lost == "class":
        s.api.classes.clear()
    elif lost == "secret":
        del s.kube.secrets[("ns", "group-backup")]
    for _attempt in range(2):
        with pytest.raises(errors.CephCSIError) as raised:
            s.worker.process("groupsnapcontent-1")
        assert raised.value.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    now = s.now()
    assert g.BEING_CREATED in now["metadata"]["annotations"], "no answer of the driver: the annotation stays"
    assert now["metadata"]["finalizers"] == [g.BOUND_FINALIZER] and not s.groups.created and not s.groups.deleted
    assert now["status"]["error"]["message"] == raised.value.message
    assert s.events.reasons() == ["GroupSnapshotCreationFailed"] * 2


def test_retain_keeps_the_group_and_releases_the_finalizer() -> None:
    s = GroupSetup(group_content(policy="Retain", deleting=True, status=dict(CUT), annotations={g.BEING_DELETED: "yes"}))
    s.worker.process("groupsnapcontent-1")
    assert not s.groups.deleted and s.now()["metadata"]["finalizers"] == []


def test_a_pre_provisioned_content_is_read_with_get_and_deleted_unbound() -> None:
    handles = {"volumeGroupSnapshotHandle": GROUP_HANDLE, "volumeSnapshotHandles": ["snap-id-1", "snap-id-2"]}
    s = GroupSetup(group_content(source={"groupSnapshotHandles": handles}, annotations=DELETION,
                                 volumeGroupSnapshotRef={"name": "backup", "namespace": "ns"}))
    s.worker.process("groupsnapcontent-1")
    (got,) = s.groups.got
    assert (got.group_snapshot_id, list(got.snapshot_ids), dict(got.secrets)) == (
        GROUP_HANDLE, ["snap-id-1", "snap-id-2"], SECRET)
    status = s.now()["status"]
    assert status["volumeGroupSnapshotHandle"] == GROUP_HANDLE and status["readyToUse"] is True
    assert "volumeSnapshotInfoList" not in status, "as csi-snapshotter: no members listed for an imported group"
    deleted = {**s.now(), "metadata": {**s.now()["metadata"], "deletionTimestamp": "2030-01-01T00:00:00Z"}}
    s.contents.put(deleted)
    s.worker.process("groupsnapcontent-1")
    (request,) = s.groups.deleted
    assert list(request.snapshot_ids) == ["snap-id-1", "snap-id-2"], "the spec's handles when the status lists none"


def test_without_the_crds_the_loop_says_so_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    s = GroupSetup()
    s.api.served = lambda: False  # type: ignore[method-assign]
    loop = GroupSnapshotterLoop(s.ctx, workers=1, backoff=ItemBackoffSettings(0.001, 0.02), discovery_interval=0.01)
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="cephcsi.sidecars.snapshotter.loop"):
        loop.start(stop)
        time.sleep(0.1)
        stop.set()
        assert loop.stop(timeout=5.0)
    notices = [r for r in caplog.records if "not installed" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in notices] == [(logging.INFO, (
        "VolumeGroupSnapshot CRDs not installed; group snapshotter idle until they are (groupsnapshot.storage.k8s.io_*.yaml "
        "of kubernetes-csi/external-snapshotter client/config/crd)"))]
    assert not s.contents.started.is_set()


# ---- the snapshotter and the members of a group ---------------------------------------------------

MEMBER_ANNOTATIONS = {c.GROUP_HANDLE_ANNOTATION: GROUP_HANDLE, c.DELETION_SECRET_NAME: "deleter",
                      c.DELETION_SECRET_NAMESPACE: "sys"}


def test_a_member_content_is_never_created_and_its_readiness_is_listed() -> None:
    s = Setup(snapshot_content(annotations=MEMBER_ANNOTATIONS, volumeSnapshotClassName=None),
              controller=FakeSnapshotController(existing={"snap-id-1": True}))
    s.worker.process("snapcontent-1")
    assert not s.controller.created, "the snapshot-controller has not written its status yet: nothing to do"
    s.contents.put({**s.now(), "status": {"snapshotHandle": "snap-id-1", "volumeGroupSnapshotHandle": GROUP_HANDLE,
                                          "readyToUse": False}})
    s.worker.process("snapcontent-1")
    (listed,) = s.controller.listed
    assert listed.snapshot_id == "snap-id-1" and dict(listed.secrets)["userID"] == "deleter"
    assert s.now()["status"]["readyToUse"] is True and not s.controller.created


def test_a_deleted_member_content_leaves_its_snapshot_to_the_group() -> None:
    s = Setup(snapshot_content(deleting=True, annotations={**MEMBER_ANNOTATIONS, c.BEING_DELETED: "yes"},
                               status={"snapshotHandle": "snap-id-1", "volumeGroupSnapshotHandle": GROUP_HANDLE,
                                       "readyToUse": True}))
    s.worker.process("snapcontent-1")
    assert not s.controller.deleted, "DeleteVolumeGroupSnapshot removes it, with its group"
    assert s.now()["metadata"]["finalizers"] == []
