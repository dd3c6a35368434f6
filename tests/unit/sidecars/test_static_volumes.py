"""Static (pre-provisioned) PVs: the provisioner never deletes their image and says why on the PV;
DeleteVolume of a bare image name is a no-op that touches no Ceph cluster."""
from __future__ import annotations

import threading
from typing import Any

import pytest

from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.sidecars.provisioner.delete import VolumeWorker
from cephcsi.sidecars.provisioner.static import REASON, is_static_pv
from cephcsi.volumes.manager import VolumeManager
from tests.unit.sidecars.fixtures import DRIVER, FakeApi, FakeInformer, context

pytestmark = pytest.mark.unit

PV_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"


def static_pv(*, policy: str = "Delete", phase: str = "Released", static: str = "true",
              finalizers: tuple[str, ...] = (), annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "static-pv", "uid": "u-static", "finalizers": list(finalizers),
                         "annotations": dict(annotations or {})},
            "status": {"phase": phase},
            "spec": {"persistentVolumeReclaimPolicy": policy,
                     "csi": {"driver": DRIVER, "volumeHandle": "static-image",
                             "volumeAttributes": {"staticVolume": static, "clusterID": "c1", "pool": "rbd"}}}}


def run(volume: dict[str, Any], times: int = 1) -> tuple[FakeApi, list[str], list[str]]:
    api = FakeApi(pvs={"static-pv": volume})
    ctx = context(volumes=FakeInformer(volume), api=api)
    worker = VolumeWorker(ctx, threading.Event())
    for _ in range(times):
        worker.process("static-pv")
    return api, ctx.controller.deleted, ctx.events.reasons()  # type: ignore[attr-defined]


def test_detection() -> None:
    assert is_static_pv(static_pv(), DRIVER)
    assert is_static_pv(static_pv(static="True"), DRIVER)
    assert not is_static_pv(static_pv(static="false"), DRIVER)
    assert not is_static_pv(static_pv(), "other.csi.example.com")


def test_released_static_pv_with_delete_policy_is_never_deleted_and_warned_once() -> None:
    api, deleted, reasons = run(static_pv(), times=3)
    assert deleted == [] and api.names() == []
    assert reasons == [REASON]


def test_static_pv_even_when_annotated_as_provisioned_by_us() -> None:
    volume = static_pv(finalizers=(PV_FINALIZER,), annotations={"pv.kubernetes.io/provisioned-by": DRIVER})
    api, deleted, reasons = run(volume)
    assert deleted == []
    assert api.names() == ["remove_pv_finalizer"]  # nothing for that finalizer to guard
    assert reasons == [REASON]


def test_retained_static_pv_is_quiet() -> None:
    api, deleted, reasons = run(static_pv(policy="Retain"))
    assert (deleted, api.names(), reasons) == ([], [], [])


class _NoCeph:
    def session(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("DeleteVolume of a static volume must not connect to Ceph")


def test_delete_volume_of_a_bare_image_name_is_a_no_op() -> None:
    manager = VolumeManager(clusters=None, connections=_NoCeph(), instance_id="default",  # type: ignore[arg-type]
                            keeper=LeaseKeeper())
    manager.delete("static-image", {})  # no secrets needed, nothing touched
