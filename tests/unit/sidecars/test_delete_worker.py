"""The volume worker: DeleteVolume for released PVs, the PV finalizer, the attachment guard."""
from __future__ import annotations

import threading

import pytest

from cephcsi import errors
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.delete import ATTACHED_PV_INDEX, VolumeWorker, attachment_pv_index
from cephcsi.sidecars.provisioner.delete import settled as volume_settled
from tests.unit.sidecars.fixtures import DRIVER, FAKE_KEY, FakeApi, FakeInformer, claim, context

pytestmark = pytest.mark.unit

PV_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"


def pv(name: str = "pvc-u1", *, phase: str = "Released", policy: str = "Delete", finalizers: tuple[str, ...] = (PV_FINALIZER,),
       annotations: dict[str, str] | None = None, deleting: bool = False, driver: str = DRIVER) -> KubeObject:
    ann = {"pv.kubernetes.io/provisioned-by": driver,
           "volume.kubernetes.io/provisioner-deletion-secret-name": "ceph",
           "volume.kubernetes.io/provisioner-deletion-secret-namespace": "sys"}
    if annotations is not None:
        ann = annotations
    meta: KubeObject = {"name": name, "annotations": ann, "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}, "spec": {
        "persistentVolumeReclaimPolicy": policy, "storageClassName": "fast",
        "claimRef": {"namespace": "ns", "name": "data", "uid": "u1"},
        "csi": {"driver": driver, "volumeHandle": "vol-1"}}}


def run(volume: KubeObject, *, attachments: FakeInformer | None = None, claims: FakeInformer | None = None,
        api: FakeApi | None = None) -> tuple[FakeApi, list[str], list[str]]:
    api = api or FakeApi(secrets={("sys", "ceph"): {"userID": "u", "userKey": FAKE_KEY}}, pvs={"pvc-u1": volume})
    ctx = context(volumes=FakeInformer(volume), attachments=attachments, claims=claims, api=api)
    VolumeWorker(ctx, threading.Event()).process("pvc-u1")
    return api, ctx.controller.deleted, ctx.events.reasons()  # type: ignore[attr-defined]


def test_released_pv_is_deleted_in_order() -> None:
    api, deleted, _ = run(pv())
    assert deleted == ["vol-1"]
    assert api.names() == ["get_pv", "read_secret", "delete_pv", "remove_pv_finalizer"]


def test_bound_pv_is_left_alone() -> None:
    api, deleted, _ = run(pv(phase="Bound"), claims=FakeInformer(claim("data", "ns", uid="u1")))
    assert not deleted and api.names() == []


def test_bound_pv_whose_claim_is_gone_is_deleted() -> None:
    api, deleted, _ = run(pv(phase="Bound"))
    assert deleted == ["vol-1"]
    assert ("get_pvc", "ns", "data") in api.calls


def test_retain_only_drops_the_finalizer() -> None:
    api, deleted, _ = run(pv(policy="Retain"))
    assert not deleted and api.names() == ["remove_pv_finalizer"]


def test_attached_pv_is_not_deleted() -> None:
    attachment = {"metadata": {"name": "va"}, "spec": {"nodeName": "n1", "source": {"persistentVolumeName": "pvc-u1"}}}
    attachments = FakeInformer(attachment, indexes={ATTACHED_PV_INDEX: attachment_pv_index})
    with pytest.raises(errors.FailedPrecondition, match="still attached to node n1"):
        run(pv(), attachments=attachments)


def test_failed_delete_is_reported_on_the_pv() -> None:
    api = FakeApi(pvs={"pvc-u1": pv()})  # the deletion secret is missing
    volume = pv()
    ctx = context(volumes=FakeInformer(volume), api=api)
    with pytest.raises(errors.FailedPrecondition, match="recreate it"):
        VolumeWorker(ctx, threading.Event()).process("pvc-u1")
    assert ctx.events.reasons() == ["VolumeFailedDelete"]  # type: ignore[attr-defined]


def test_deleted_pv_without_our_finalizer_is_past_our_part() -> None:
    api, deleted, _ = run(pv(deleting=True, finalizers=("kubernetes.io/pv-protection",)))
    assert not deleted and api.names() == []


def test_pv_deleted_directly_is_deleted_from_ceph() -> None:
    api, deleted, _ = run(pv(phase="Available", deleting=True))
    assert deleted == ["vol-1"]


def test_pvs_of_other_drivers_are_ignored() -> None:
    api, deleted, _ = run(pv(driver="other.example.com"))
    assert not deleted and api.names() == []


def test_legacy_pv_gets_the_finalizer() -> None:
    api, deleted, _ = run(pv(phase="Bound", finalizers=()), claims=FakeInformer(claim("data", "ns", uid="u1")))
    assert api.names() == ["add_pv_finalizer"] and not deleted


def test_deletion_secret_falls_back_to_the_class() -> None:
    volume = pv(annotations={"pv.kubernetes.io/provisioned-by": DRIVER})
    api, deleted, _ = run(volume, api=FakeApi(secrets={("sys", "ceph"): {"userID": "u", "userKey": FAKE_KEY}},
                                              pvs={"pvc-u1": volume}))
    assert deleted == ["vol-1"] and ("read_secret", "sys", "ceph") in api.calls


def claim_uids(*claims: KubeObject) -> dict[str, str]:
    return {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c["metadata"]["uid"] for c in claims}


@pytest.mark.parametrize("volume, settled", [
    (pv(phase="Bound"), True),
    (pv(phase="Released"), False),
    (pv(phase="Bound", deleting=True), False),
    (pv(phase="Bound", finalizers=()), False),  # the worker adds the finalizer
    (pv(phase="Bound", policy="Retain"), False),  # the worker drops the finalizer
])
def test_a_settled_pv_is_one_the_worker_leaves_alone(volume: KubeObject, settled: bool) -> None:
    """The handlers keep settled PVs out of the queue (no replay at start): only those on which
    the worker would do nothing may count as settled."""
    bound = claim("data", "ns", uid="u1")
    assert volume_settled(volume, claim_uids(bound).get) is settled
    api, deleted, _ = run(volume, claims=FakeInformer(bound))
    if settled:
        assert not deleted and api.names() == []


def test_a_bound_pv_whose_claim_is_gone_or_replaced_is_not_settled() -> None:
    assert not volume_settled(pv(phase="Bound"), claim_uids().get)
    assert not volume_settled(pv(phase="Bound"), claim_uids(claim("data", "ns", uid="other")).get)
