"""The claim worker's flows against fakes: provision, adopt, fail, reschedule, clean up."""
from __future__ import annotations

import threading

import pytest

from cephcsi import errors
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.provision import ClaimWorker
from tests.unit.sidecars.fixtures import FAKE_KEY, FINALIZER, FakeApi, FakeController, FakeEvents, FakeInformer, claim, context, storage_class

pytestmark = pytest.mark.unit

SECRETS = {("sys", "ceph"): {"userID": "u", "userKey": FAKE_KEY}}


def worker(*claims: KubeObject, **kw: object) -> tuple[ClaimWorker, FakeApi, FakeController, FakeEvents]:
    ctx = context(claims=FakeInformer(*claims), **kw)  # type: ignore[arg-type]
    return ClaimWorker(ctx, threading.Event()), ctx.api, ctx.controller, ctx.events  # type: ignore[return-value]


def test_provision_happy_path_in_order() -> None:
    c = claim("data", "ns", uid="u1")
    w, api, controller, events = worker(c)
    w.process("ns/data")
    assert api.names() == ["get_pv", "read_secret", "add_pvc_finalizer", "create_pv", "remove_pvc_finalizer"]
    (request,) = controller.created
    assert request.name == "pvc-u1" and dict(request.secrets) == {"userID": "u", "userKey": FAKE_KEY}
    assert api.pvs["pvc-u1"]["spec"]["claimRef"]["uid"] == "u1"
    assert events.reasons() == ["Provisioning", "ProvisioningSucceeded"]


def test_a_class_the_cache_has_not_seen_yet_is_read_live() -> None:
    # A class created right before its claim can lag in the informer: no "not found" event then.
    api = FakeApi(secrets=dict(SECRETS), classes={"fast": storage_class()})
    w, api, controller, events = worker(claim("data", "ns", uid="u1"), classes=FakeInformer(), api=api)
    w.process("ns/data")
    assert api.names()[:3] == ["get_storage_class", "get_pv", "read_secret"]
    assert len(controller.created) == 1
    assert events.reasons() == ["Provisioning", "ProvisioningSucceeded"]


def test_a_class_missing_live_too_fails_the_claim_by_name() -> None:
    w, api, controller, events = worker(claim("data", "ns", uid="u1"), classes=FakeInformer())
    with pytest.raises(errors.InvalidArgument):
        w.process("ns/data")
    assert events.reasons() == ["ProvisioningFailed"]
    assert 'storageclass.storage.k8s.io "fast" not found' in events.recorded[0][3]
    assert not controller.created


def test_a_pv_of_this_claim_the_cache_lacks_yet_is_found_live_and_not_provisioned_again() -> None:
    # A claim update (our finalizer removal) can reach the worker before the PV's watch event.
    c = claim("data", "ns", uid="u1", finalizers=(FINALIZER,))
    api = FakeApi(secrets=SECRETS, pvs={"pvc-u1": {"metadata": {"name": "pvc-u1"}, "spec": {"claimRef": {"uid": "u1"}}}})
    w, api, controller, events = worker(c, api=api)
    w.process("ns/data")
    assert api.names() == ["get_pv", "remove_pvc_finalizer"]
    assert not controller.created and events.reasons() == []


def test_a_finished_claim_the_pv_cache_lags_behind_is_skipped_without_counting() -> None:
    c = claim("data", "ns", uid="u1")
    api = FakeApi(secrets=SECRETS, pvs={"pvc-u1": {"metadata": {"name": "pvc-u1"}, "spec": {"claimRef": {"uid": "u1"}}}})
    w, api, controller, events = worker(c, api=api)
    w.process("ns/data")
    assert api.names() == ["get_pv"] and not controller.created and events.reasons() == []


def test_a_pv_created_by_someone_else_while_create_volume_ran_is_adopted() -> None:
    c = claim("data", "ns", uid="u1")
    controller = FakeController()
    w, api, _, events = worker(c, controller=controller)
    controller.on_create = lambda: api.pvs.update(
        {"pvc-u1": {"metadata": {"name": "pvc-u1"}, "spec": {"claimRef": {"uid": "u1"}}}})
    w.process("ns/data")
    assert api.names()[-3:] == ["create_pv", "get_pv", "remove_pvc_finalizer"]
    assert events.reasons() == ["Provisioning", "ProvisioningSucceeded"]


def test_pv_of_another_claim_is_an_error() -> None:
    c = claim("data", "ns", uid="u1")
    api = FakeApi(secrets=SECRETS, pvs={"pvc-u1": {"metadata": {"name": "pvc-u1"}, "spec": {"claimRef": {"uid": "zz"}}}})
    w, api, _, events = worker(c, api=api)
    with pytest.raises(errors.Internal, match="belongs to claim uid"):
        w.process("ns/data")
    assert events.reasons() == ["Provisioning", "ProvisioningFailed"]


def test_bad_parameter_reports_the_csi_error_and_retries() -> None:
    c = claim("data", "ns")
    controller = FakeController()
    controller.error = errors.InvalidArgument("unknown parameter(s) colour")
    w, api, _, events = worker(c, controller=controller)
    with pytest.raises(errors.InvalidArgument):
        w.process("ns/data")
    assert events.recorded[-1][2:] == ("ProvisioningFailed", 'failed to provision volume with StorageClass "fast": '
                                       "rpc error: code = InvalidArgument desc = unknown parameter(s) colour")
    assert "create_pv" not in api.names()


def test_missing_secret_fails_before_anything_is_created() -> None:
    c = claim("data", "ns")
    w, api, controller, events = worker(c, api=FakeApi())
    with pytest.raises(errors.InvalidArgument, match='secrets "ceph" not found'):
        w.process("ns/data")
    assert not controller.created and "add_pvc_finalizer" not in api.names()


def test_resource_exhausted_on_a_selected_node_reschedules() -> None:
    c = claim("data", "ns", annotations={"volume.kubernetes.io/selected-node": "n1"})
    controller = FakeController()
    controller.error = errors.ResourceExhausted("no space")
    classes = FakeInformer(storage_class(volumeBindingMode="WaitForFirstConsumer"))
    w, api, _, _ = worker(c, controller=controller, classes=classes)
    with pytest.raises(errors.ResourceExhausted):
        w.process("ns/data")
    assert ("remove_pvc_annotation", "ns", "data", "volume.kubernetes.io/selected-node") in api.calls


def test_claim_deleted_while_create_volume_ran_is_cleaned_up() -> None:
    c = claim("data", "ns", uid="u1")
    claims = FakeInformer(c)
    controller = FakeController()
    # The claim goes Terminating (kept by our finalizer) while CreateVolume runs.
    controller.on_create = lambda: claims.put(claim("data", "ns", uid="u1", deleting=True, finalizers=(FINALIZER,)))
    ctx = context(claims=claims, controller=controller)
    ClaimWorker(ctx, threading.Event()).process("ns/data")
    assert len(controller.created) == 1 and len(controller.deleted) == 1
    assert not controller.volumes.journal, "the volume must be deleted"
    assert "create_pv" not in ctx.api.names()  # type: ignore[attr-defined]
    assert ctx.api.names()[-1] == "remove_pvc_finalizer"  # type: ignore[attr-defined]


def test_cleanup_after_a_crash_finds_the_volume_in_the_journal() -> None:
    c = claim("data", "ns", uid="u1", deleting=True, finalizers=(FINALIZER,))
    controller = FakeController()
    controller.volumes.journal["pvc-u1"] = "0001-0002-c1-0000000000000001-left-behind"
    w, api, _, _ = worker(c, controller=controller)
    w.process("ns/data")
    assert controller.deleted == ["0001-0002-c1-0000000000000001-left-behind"]
    assert api.names() == ["get_pv", "read_secret", "remove_pvc_finalizer"]


def test_cleanup_leaves_the_volume_when_the_pv_exists_live() -> None:
    c = claim("data", "ns", uid="u1", deleting=True, finalizers=(FINALIZER,))
    controller = FakeController()
    controller.volumes.journal["pvc-u1"] = "vol"
    api = FakeApi(secrets=SECRETS, pvs={"pvc-u1": {"metadata": {"name": "pvc-u1"}}})
    w, api, _, _ = worker(c, controller=controller, api=api)
    w.process("ns/data")
    assert not controller.deleted and api.names() == ["get_pv", "remove_pvc_finalizer"]


def test_cleanup_waits_for_a_create_still_running() -> None:
    c = claim("data", "ns", uid="u1", deleting=True, finalizers=(FINALIZER,))
    w, api, controller, _ = worker(c)
    gate = threading.Event()
    w.ctx.calls.timeout = 0.1
    with pytest.raises(errors.DeadlineExceeded):
        w.ctx.calls.run("CreateVolume", "pvc-u1", lambda: gate.wait(5))
    with pytest.raises(errors.OperationInFlight, match="still running"):
        w.process("ns/data")
    gate.set()
    assert w.ctx.calls.drain(2)
    w.process("ns/data")
    assert api.names()[-1] == "remove_pvc_finalizer"


def test_cleanup_without_the_class_gives_up_loudly() -> None:
    c = claim("data", "ns", uid="u1", storage_class="gone", deleting=True, finalizers=(FINALIZER,))
    w, api, controller, events = worker(c)
    w.process("ns/data")
    assert events.reasons() == ["ProvisioningCleanupFailed"]
    assert "may remain" in events.recorded[0][3]
    assert api.names()[-1] == "remove_pvc_finalizer"


def test_release_when_the_pv_exists_in_the_cache() -> None:
    c = claim("data", "ns", uid="u1", finalizers=(FINALIZER,))
    w, api, controller, _ = worker(c, volumes=FakeInformer({"metadata": {"name": "pvc-u1"}}))
    w.process("ns/data")
    assert api.names() == ["remove_pvc_finalizer"] and not controller.created
