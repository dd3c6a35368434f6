"""The attacher's strategy choice and the trivial handler."""
from __future__ import annotations

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.sidecars.attacher.strategy import TrivialAttach, publishes
from cephcsi.sidecars.objects import KubeObject
from tests.unit.sidecars.fixtures import FakeApi

pytestmark = pytest.mark.unit

_RPC = csi_pb2.ControllerServiceCapability.RPC


def cap(kind: csi_pb2.ControllerServiceCapability.RPC.Type) -> csi_pb2.ControllerServiceCapability:
    return csi_pb2.ControllerServiceCapability(rpc=_RPC(type=kind))


def va(attached: bool = False, deleting: bool = False) -> KubeObject:
    meta: KubeObject = {"name": "csi-abc"}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"attacher": "rbd.csi.ceph.com", "nodeName": "n1",
                                       "source": {"persistentVolumeName": "pvc-1"}}, "status": {"attached": attached}}


def test_the_publish_capability_chooses_the_publishing_strategy() -> None:
    assert not publishes([cap(_RPC.CREATE_DELETE_VOLUME)])
    assert publishes([cap(_RPC.CREATE_DELETE_VOLUME), cap(_RPC.PUBLISH_UNPUBLISH_VOLUME)])


def test_trivial_marks_attached_once() -> None:
    api = FakeApi()
    handler = TrivialAttach(api)  # type: ignore[arg-type]
    handler.sync(va())
    handler.sync(va(attached=True))
    handler.sync(va(deleting=True))
    assert api.names() == ["mark_attached"]


def test_trivial_settled_attachments_are_those_it_leaves_alone() -> None:
    api = FakeApi()
    handler = TrivialAttach(api)  # type: ignore[arg-type]
    assert handler.settled(va(attached=True))
    assert not handler.settled(va()) and not handler.settled(va(attached=True, deleting=True))
    handler.sync(va(attached=True))
    assert api.names() == []
