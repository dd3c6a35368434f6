"""Crash safety of provisioning (weakness #2 of external-provisioner: in-progress claims live only
in memory, and a claim deleted mid-provision leaks its image).

The controller is killed at the journal's crash points (CEPHCSI_FAILPOINTS makes the process
SIGKILL itself there), and claims are deleted while nothing runs or while Ceph hangs."""
from __future__ import annotations

import pytest

from tests.integration.sidecars.conftest import Env, StartControllers
from tests.integration.sidecars.harness import (
    DRIVER,
    PROVISIONING_FINALIZER,
    images_with,
    journal_names,
    new_prefix,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]


def phase(env: Env, namespace: str, name: str) -> str:
    return str(((env.kube.pvc(namespace, name) or {}).get("status") or {}).get("phase") or "")


@pytest.mark.parametrize("point", ["create.after-reserve", "create.after-image"])
def test_killed_mid_create_then_retry_reuses_the_same_volume(env: Env, start_controllers: StartControllers,
                                                             kube_namespace: str, point: str) -> None:
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    (crashing,) = start_controllers(environ={"CEPHCSI_FAILPOINTS": point})
    uid = env.kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
    wait_for("the controller to die at the crash point", lambda: crashing.process.poll() is not None)  # type: ignore[union-attr]
    reserved = journal_names(env.ceph)[f"pvc-{uid}"]
    claim = env.kube.pvc(kube_namespace, "data") or {}
    assert PROVISIONING_FINALIZER in claim["metadata"]["finalizers"], "in progress must be durable before CreateVolume"
    assert env.kube.pv(f"pvc-{uid}") is None

    start_controllers()  # waits out the dead leader's Lease, then finishes the job
    wait_for("Bound", lambda: phase(env, kube_namespace, "data") == "Bound")
    assert journal_names(env.ceph)[f"pvc-{uid}"] == reserved, "the retry must land on the same journal entry"
    assert images_with(env.ceph, prefix) == [f"{prefix}{reserved}"]
    assert len(env.kube.pvs_of(kube_namespace)) == 1
    assert PROVISIONING_FINALIZER not in (env.kube.pvc(kube_namespace, "data") or {})["metadata"].get("finalizers", [])
    env.kube.delete_pvc(kube_namespace, "data")
    wait_for("the image to be deleted", lambda: not images_with(env.ceph, prefix))


def test_claim_deleted_while_no_controller_runs_is_cleaned_up(env: Env, start_controllers: StartControllers,
                                                               kube_namespace: str) -> None:
    """The leak external-provisioner has: the leader dies after the image exists but before the PV,
    and the claim is deleted before anyone retries."""
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    (crashing,) = start_controllers(environ={"CEPHCSI_FAILPOINTS": "create.after-image"})
    uid = env.kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
    wait_for("the controller to die after creating the image", lambda: crashing.process.poll() is not None)  # type: ignore[union-attr]
    assert len(images_with(env.ceph, prefix)) == 1
    env.kube.delete_pvc(kube_namespace, "data")
    claim = env.kube.pvc(kube_namespace, "data") or {}
    assert claim["metadata"].get("deletionTimestamp"), "the claim waits for the clean-up (Terminating)"

    start_controllers()
    wait_for("the claim to go", lambda: env.kube.pvc(kube_namespace, "data") is None)
    assert not images_with(env.ceph, prefix), "the image of a claim deleted mid-provision must not leak"
    assert f"pvc-{uid}" not in journal_names(env.ceph)
    assert env.kube.pv(f"pvc-{uid}") is None


def test_claim_deleted_while_ceph_hangs_is_cleaned_up(env: Env, start_controllers: StartControllers,
                                                      kube_namespace: str) -> None:
    """A live leader whose CreateVolume hangs in Ceph: bounded by the op timeouts, reported, and
    once Ceph answers the deleted claim's volume is removed, not leaked."""
    (controller,) = start_controllers(args=["--timeout=3s"])
    prefix = new_prefix()
    storage_class = env.kube.create_storage_class(env.ceph, env.secret, prefix=prefix)
    env.ceph.freeze()
    try:
        uid = env.kube.create_pvc(kube_namespace, "data", storage_class)["metadata"]["uid"]
        wait_for("the finalizer (CreateVolume about to run)", lambda: PROVISIONING_FINALIZER in (
            (env.kube.pvc(kube_namespace, "data") or {})["metadata"].get("finalizers") or []))
        failed = wait_for("ProvisioningFailed from the bounded call", lambda: [
            m for _t, r, m in env.kube.events(kube_namespace, "data", DRIVER) if r == "ProvisioningFailed"], timeout=30)
        assert any("DeadlineExceeded" in m or "Unavailable" in m for m in failed), failed
        env.kube.delete_pvc(kube_namespace, "data")
    finally:
        env.ceph.thaw()
    wait_for("the claim to go", lambda: env.kube.pvc(kube_namespace, "data") is None, timeout=90)
    assert not images_with(env.ceph, prefix)
    assert f"pvc-{uid}" not in journal_names(env.ceph)
    assert controller.process is not None and controller.process.poll() is None, "the controller survives the outage"
