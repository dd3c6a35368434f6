"""Taking over VolumeAttachments and PVs left by ceph-csi >= 3.15's csi-attacher (the real
external-attacher handler): finish or tear down, and drop its finalizer."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.sidecars.attacher.controller import AttacherLoop
from cephcsi.sidecars.attacher.legacy import ANN_NODE_ID, LegacyTakeover, legacy_finalizer
from cephcsi.sidecars.attacher.strategy import TrivialAttach
from tests.unit.sidecars.fixtures import DRIVER, FakeApi, FakeInformer

pytestmark = pytest.mark.unit

OLD = "external-attacher/rbd-csi-ceph-com"


@dataclass
class AttachApi(FakeApi):
    def mark_detached(self, name: str) -> None:
        self._record("mark_detached", name)

    def remove_attachment_finalizer(self, name: str, finalizer: str) -> None:
        self._record("remove_attachment_finalizer", name, finalizer)


def upstream_va(*, attached: bool = True, deleting: bool = False, error: bool = False) -> dict[str, Any]:
    """A VolumeAttachment as external-attacher's csi_handler leaves it."""
    meta: dict[str, Any] = {"name": "csi-abc", "finalizers": [OLD], "annotations": {ANN_NODE_ID: "node-1"}}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    status: dict[str, Any] = {"attached": attached}
    if error:
        status["attachError"] = {"message": "rpc error", "time": "2030-01-01T00:00:00Z"}
    return {"metadata": meta, "spec": {"attacher": DRIVER, "nodeName": "n1",
                                       "source": {"persistentVolumeName": "pvc-1"}}, "status": status}


def upstream_pv(*, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "pvc-1", "finalizers": ["kubernetes.io/pv-protection", OLD]}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"csi": {"driver": DRIVER, "volumeHandle": "0001-x"}}}


def loop(api: AttachApi, attachments: FakeInformer, volumes: FakeInformer) -> AttacherLoop:
    takeover = LegacyTakeover(api, DRIVER, attachments)  # type: ignore[arg-type]
    return AttacherLoop(DRIVER, attachments, TrivialAttach(api), workers=1,  # type: ignore[arg-type]
                        backoff=ItemBackoffSettings(0.01, 0.1), volumes=volumes, takeover=takeover)  # type: ignore[arg-type]


def test_finalizer_name_is_external_attachers() -> None:
    assert legacy_finalizer("rbd.csi.ceph.com") == OLD
    assert legacy_finalizer("x.") == "external-attacher/x-X"


def test_attached_va_is_taken_over() -> None:
    api = AttachApi()
    loop(api, FakeInformer(upstream_va()), FakeInformer())._process("csi-abc")
    assert api.calls == [("remove_attachment_finalizer", "csi-abc", OLD)]


def test_failed_attach_is_finished_then_taken_over() -> None:
    api = AttachApi()
    loop(api, FakeInformer(upstream_va(attached=False, error=True)), FakeInformer())._process("csi-abc")
    assert api.names() == ["mark_attached", "remove_attachment_finalizer"]


def test_deleted_va_is_detached_status_first() -> None:
    api = AttachApi()
    loop(api, FakeInformer(upstream_va(deleting=True)), FakeInformer())._process("csi-abc")
    assert api.calls == [("mark_detached", "csi-abc"), ("remove_attachment_finalizer", "csi-abc", OLD)]


def test_own_attachments_are_untouched() -> None:
    api = AttachApi()
    own = upstream_va(deleting=True)
    own["metadata"]["finalizers"] = []
    loop(api, FakeInformer(own), FakeInformer())._process("csi-abc")
    assert api.calls == []


def test_pv_keeps_the_finalizer_while_an_attachment_names_it() -> None:
    api = AttachApi()
    attachments = FakeInformer(upstream_va())
    attacher = loop(api, attachments, FakeInformer(upstream_pv(deleting=True)))
    attacher._process("pv/pvc-1")
    assert api.calls == []
    attachments.remove("csi-abc")
    attacher._process("pv/pvc-1")
    assert api.calls == [("remove_pv_finalizer", "pvc-1", OLD)]


def test_pv_of_another_driver_is_ignored() -> None:
    api = AttachApi()
    other = upstream_pv()
    other["spec"]["csi"]["driver"] = "other.example.com"
    loop(api, FakeInformer(), FakeInformer(other))._process("pv/pvc-1")
    assert api.calls == []
