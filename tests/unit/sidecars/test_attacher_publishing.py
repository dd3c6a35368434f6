"""The attacher's publishing strategy (external-attacher's real handler) against fakes: the
order of finalizers, ControllerPublish and status on attach; attachError/detachError on
failures; markAsDetached before the finalizer goes; secrets and node id resolution; the
finalizer is external-attacher's, so attachments ceph-csi's csi-attacher left are ours, and the
interim development name is replaced."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.errors import CephCSIError, FailedPrecondition
from cephcsi.sidecars.attacher.publishing import PublishingAttach, finalizer_for, interim_finalizer_for, node_id_of
from cephcsi.sidecars.objects import KubeObject
from tests.unit.sidecars.fixtures import FakeInformer

pytestmark = pytest.mark.unit

DRIVER = "rbd.csi.ceph.com"
FINALIZER = "external-attacher/rbd-csi-ceph-com"
"""What ceph-csi's csi-attacher (external-attacher) puts on VolumeAttachments and PVs."""
INTERIM = "attacher.cephcsi/rbd-csi-ceph-com"


class Api:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def add_attachment_finalizer(self, name: str, finalizer: str) -> None:
        self.calls.append(("add_va_finalizer", name, finalizer))

    def add_pv_finalizer(self, name: str, finalizer: str) -> None:
        self.calls.append(("add_pv_finalizer", name, finalizer))

    def remove_pv_finalizer(self, name: str, finalizer: str) -> None:
        self.calls.append(("remove_pv_finalizer", name, finalizer))

    def mark_attached(self, name: str, metadata: dict[str, str] | None = None) -> None:
        self.calls.append(("mark_attached", name))

    def mark_detached(self, name: str) -> None:
        self.calls.append(("mark_detached", name))

    def remove_attachment_finalizer(self, name: str, finalizer: str) -> None:
        self.calls.append(("remove_va_finalizer", name, finalizer))

    def save_attach_error(self, name: str, message: str) -> None:
        self.calls.append(("attach_error", name, message))

    def save_detach_error(self, name: str, message: str) -> None:
        self.calls.append(("detach_error", name, message))

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        self.calls.append(("read_secret", namespace, name))
        return {"userID": "csi", "userKey": "k"}


class Controller:
    def __init__(self, fail: CephCSIError | None = None) -> None:
        self.fail = fail
        self.requests: list[Any] = []

    def ControllerPublishVolume(self, request: Any, context: object) -> csi_pb2.ControllerPublishVolumeResponse:  # noqa: N802
        self.requests.append(request)
        if self.fail:
            raise self.fail
        return csi_pb2.ControllerPublishVolumeResponse()

    def ControllerUnpublishVolume(self, request: Any, context: object) -> csi_pb2.ControllerUnpublishVolumeResponse:  # noqa: N802
        self.requests.append(request)
        if self.fail:
            raise self.fail
        return csi_pb2.ControllerUnpublishVolumeResponse()


class Calls:
    def run(self, method: str, name: str, call: Callable[[], Any], stop: Any = None) -> Any:
        return call()


def pv(**annotations: str) -> KubeObject:
    return {"metadata": {"name": "pvc-1", "annotations": annotations, "finalizers": []},
            "spec": {"accessModes": ["ReadWriteOnce"], "csi": {
                "driver": DRIVER, "volumeHandle": "vol-1", "fsType": "ext4", "volumeAttributes": {"pool": "rbd"}}}}


def va(*, deleting: bool = False, attached: bool = False, finalizers: tuple[str, ...] = ()) -> KubeObject:
    meta: KubeObject = {"name": "csi-va", "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"attached": attached},
            "spec": {"attacher": DRIVER, "nodeName": "n1", "source": {"persistentVolumeName": "pvc-1"}}}


def strategy(api: Api, controller: Controller, volume: KubeObject, **informers: Any) -> PublishingAttach:
    return PublishingAttach(api, DRIVER, controller, Calls(), FakeInformer(volume), **informers)  # type: ignore[arg-type]


def test_attach_order_and_request() -> None:
    api, controller = Api(), Controller()
    strategy(api, controller, pv(**{
        "volume.kubernetes.io/provisioner-deletion-secret-name": "s",
        "volume.kubernetes.io/provisioner-deletion-secret-namespace": "ns"})).sync(va())
    assert [c[0] for c in api.calls] == ["add_va_finalizer", "add_pv_finalizer", "read_secret", "mark_attached"]
    assert api.calls[2] == ("read_secret", "ns", "s")  # no controllerPublishSecretRef: the provisioner's
    (request,) = controller.requests
    assert (request.volume_id, request.node_id) == ("vol-1", "n1")
    assert request.volume_capability.access_mode.mode == csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER
    assert request.volume_context == {"pool": "rbd"} and request.secrets["userID"] == "csi"


def test_attached_with_our_finalizer_is_left_alone_and_without_it_is_published() -> None:
    api, controller = Api(), Controller()
    handler = strategy(api, controller, pv())
    handler.sync(va(attached=True, finalizers=(FINALIZER,)))
    assert not api.calls and not controller.requests
    handler.sync(va(attached=True))  # attached by the trivial strategy or another attacher
    assert controller.requests and ("mark_attached", "csi-va") in api.calls


def test_publish_failure_is_saved_as_attach_error_and_raised() -> None:
    api, controller = Api(), Controller(FailedPrecondition("volume is published to node n0"))
    with pytest.raises(FailedPrecondition):
        strategy(api, controller, pv()).sync(va())
    assert api.calls[-1] == ("attach_error", "csi-va", "volume is published to node n0")
    assert "mark_attached" not in [c[0] for c in api.calls]


def test_detach_unpublishes_then_marks_detached_then_drops_the_finalizer() -> None:
    api, controller = Api(), Controller()
    strategy(api, controller, pv()).sync(va(deleting=True, attached=True, finalizers=(FINALIZER,)))
    assert [c[0] for c in api.calls] == ["mark_detached", "remove_va_finalizer"]
    assert isinstance(controller.requests[0], csi_pb2.ControllerUnpublishVolumeRequest)


def test_failed_detach_keeps_the_attachment() -> None:
    api, controller = Api(), Controller(FailedPrecondition("fencing refused"))
    with pytest.raises(FailedPrecondition):
        strategy(api, controller, pv()).sync(va(deleting=True, finalizers=(FINALIZER,)))
    assert [c[0] for c in api.calls] == ["detach_error"]


def test_deleting_without_our_finalizer_is_not_ours() -> None:
    api, controller = Api(), Controller()
    strategy(api, controller, pv()).sync(va(deleting=True))
    assert not api.calls and not controller.requests


def test_pv_finalizer_goes_only_when_deleting_and_unattached() -> None:
    api = Api()
    handler = strategy(api, Controller(), pv())
    mine: KubeObject = {"metadata": {"name": "pvc-1", "finalizers": [FINALIZER]}}
    handler.sync_volume(mine, [])
    deleting: KubeObject = {"metadata": {"name": "pvc-1", "finalizers": [FINALIZER],
                                         "deletionTimestamp": "2030-01-01T00:00:00Z"}}
    handler.sync_volume(deleting, [va()])
    assert not api.calls
    handler.sync_volume(deleting, [])
    assert api.calls == [("remove_pv_finalizer", "pvc-1", FINALIZER)]


def test_node_id_from_csinode_then_annotation_then_name() -> None:
    csinodes = FakeInformer({"metadata": {"name": "n1"}, "spec": {"drivers": [{"name": DRIVER, "nodeID": "id-1"}]}})
    nodes = FakeInformer({"metadata": {"name": "n2", "annotations": {
        "csi.volume.kubernetes.io/nodeid": '{"rbd.csi.ceph.com": "id-2"}'}}})
    assert node_id_of("n1", DRIVER, csinodes, nodes) == "id-1"  # type: ignore[arg-type]
    assert node_id_of("n2", DRIVER, csinodes, nodes) == "id-2"  # type: ignore[arg-type]
    assert node_id_of("n3", DRIVER, csinodes, nodes) == "n3"  # type: ignore[arg-type]


def test_finalizer_is_external_attachers_name() -> None:
    assert finalizer_for(DRIVER) == FINALIZER
    assert finalizer_for("x.") == "external-attacher/x-X"  # never ends with '-'
    assert finalizer_for("a_b/c") == "external-attacher/a-b-c"
    assert interim_finalizer_for(DRIVER) == INTERIM


def test_attachment_ceph_csi_attached_is_ours_and_detached_normally() -> None:
    """As external-attacher leaves it: its finalizer, the node-id annotation, attached."""
    api, controller = Api(), Controller()
    handler = strategy(api, controller, pv())
    left = va(attached=True, finalizers=(FINALIZER,))
    left["metadata"]["annotations"] = {"csi.alpha.kubernetes.io/node-id": "n1"}
    handler.sync(left)
    assert not api.calls and not controller.requests  # nothing to do, as for our own
    left["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    handler.sync(left)
    assert isinstance(controller.requests[0], csi_pb2.ControllerUnpublishVolumeRequest)
    assert api.calls == [("mark_detached", "csi-va"), ("remove_va_finalizer", "csi-va", FINALIZER)]


def test_interim_name_on_an_attached_attachment_is_replaced_new_one_first() -> None:
    api, controller = Api(), Controller()
    strategy(api, controller, pv()).sync(va(attached=True, finalizers=(INTERIM,)))
    assert api.calls == [("add_va_finalizer", "csi-va", FINALIZER), ("remove_va_finalizer", "csi-va", INTERIM)]
    assert not controller.requests


def test_interim_name_on_a_failed_attachment_is_replaced_and_attach_retried() -> None:
    api, controller = Api(), Controller()
    strategy(api, controller, pv()).sync(va(finalizers=(INTERIM,)))
    assert [c[0] for c in api.calls][:3] == ["add_va_finalizer", "remove_va_finalizer", "add_pv_finalizer"]
    assert api.calls[1] == ("remove_va_finalizer", "csi-va", INTERIM) and api.calls[-1][0] == "mark_attached"


def test_deleted_attachment_with_the_interim_name_is_detached() -> None:
    api, controller = Api(), Controller()
    strategy(api, controller, pv()).sync(va(deleting=True, attached=True, finalizers=(INTERIM,)))
    assert controller.requests
    assert api.calls == [("mark_detached", "csi-va"), ("remove_va_finalizer", "csi-va", INTERIM)]


def test_pv_interim_name_is_replaced_while_live_and_dropped_on_deletion() -> None:
    api = Api()
    handler = strategy(api, Controller(), pv())
    live: KubeObject = {"metadata": {"name": "pvc-1", "finalizers": [INTERIM]}}
    assert handler.wants_volume(live)
    handler.sync_volume(live, [va()])
    assert api.calls == [("add_pv_finalizer", "pvc-1", FINALIZER), ("remove_pv_finalizer", "pvc-1", INTERIM)]
    api.calls.clear()
    # Being deleted: no finalizer can be added; the old name waits for the last attachment.
    deleting: KubeObject = {"metadata": {"name": "pvc-1", "finalizers": [INTERIM],
                                         "deletionTimestamp": "2030-01-01T00:00:00Z"}}
    handler.sync_volume(deleting, [va()])
    assert not api.calls
    handler.sync_volume(deleting, [])
    assert api.calls == [("remove_pv_finalizer", "pvc-1", INTERIM)]
    assert not handler.wants_volume({"metadata": {"name": "other", "finalizers": ["external-attacher/other-X"]}})


@pytest.mark.parametrize("attachment, settled", [
    (va(attached=True, finalizers=(FINALIZER,)), True),  # ours, attached
    (va(attached=True), False),  # attached by another strategy: to publish
    (va(attached=True, finalizers=(INTERIM,)), False),  # the interim name to replace
    (va(attached=True, finalizers=(FINALIZER, INTERIM)), False),
    (va(finalizers=(FINALIZER,)), False),  # not attached yet
    (va(deleting=True, attached=True, finalizers=(FINALIZER,)), False),  # to detach
])
def test_a_settled_attachment_is_one_sync_leaves_alone(attachment: KubeObject, settled: bool) -> None:
    """The handler keeps settled attachments out of the queue (no replay at start or resync)."""
    api, controller = Api(), Controller()
    handler = strategy(api, controller, pv())
    assert handler.settled(attachment) is settled
    handler.sync(attachment)
    assert (not api.calls and not controller.requests) is settled


@pytest.mark.parametrize("finalizers, deleting, wanted", [
    ((FINALIZER,), False, False),  # sync_volume would do nothing
    ((FINALIZER,), True, True),
    ((INTERIM,), False, True),
    ((), True, False),  # not ours
])
def test_only_pvs_sync_volume_could_change_are_wanted(finalizers: tuple[str, ...], deleting: bool,
                                                      wanted: bool) -> None:
    api = Api()
    handler = strategy(api, Controller(), pv())
    volume: KubeObject = {"metadata": {"name": "pvc-1", "finalizers": list(finalizers)}}
    if deleting:
        volume["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    assert handler.wants_volume(volume) is wanted
    handler.sync_volume(volume, [])
    if not wanted:
        assert not api.calls
