"""Claim selection: which claims the provisioner acts on, and how."""
from __future__ import annotations

import pytest

from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.claims import Action, decide, is_candidate, settled
from cephcsi.sidecars.provisioner.names import storage_class_name
from tests.unit.sidecars.fixtures import DRIVER, FINALIZER, claim, storage_class

pytestmark = pytest.mark.unit

WFFC = storage_class(volumeBindingMode="WaitForFirstConsumer")


def action(c: KubeObject, sc: KubeObject | None = storage_class(), pv_exists: bool = False) -> Action:
    return decide(c, sc, pv_exists, DRIVER).action


def test_pending_claim_of_ours_is_provisioned() -> None:
    assert action(claim()) is Action.PROVISION


def test_beta_annotation_counts_too() -> None:
    c = claim(provisioner=None, annotations={"volume.beta.kubernetes.io/storage-provisioner": DRIVER})
    assert action(c) is Action.PROVISION


@pytest.mark.parametrize("provisioner", [None, "other.csi.example.com"])
def test_claims_for_others_are_skipped(provisioner: str | None) -> None:
    assert action(claim(provisioner=provisioner)) is Action.SKIP
    assert not is_candidate(claim(provisioner=provisioner), DRIVER)


def test_bound_or_prebound_claims_are_skipped() -> None:
    assert action(claim(volumeName="pv-static")) is Action.SKIP


def test_existing_pv_means_done() -> None:
    c = claim()
    assert action(c, pv_exists=True) is Action.SKIP
    protected = claim(finalizers=(FINALIZER,))
    assert action(protected, pv_exists=True) is Action.RELEASE


def test_wait_for_first_consumer_needs_a_selected_node() -> None:
    assert action(claim(), WFFC) is Action.SKIP
    selected = claim(annotations={"volume.kubernetes.io/selected-node": "n1"})
    assert action(selected, WFFC) is Action.PROVISION
    # After a reschedule the finalizer stays, but we wait for the scheduler again.
    assert action(claim(finalizers=(FINALIZER,)), WFFC) is Action.SKIP


def test_missing_class_fails_with_the_class_name() -> None:
    decision = decide(claim(storage_class="gone"), None, False, DRIVER)
    assert decision.action is Action.FAIL and '"gone" not found' in decision.reason


def test_class_of_another_provisioner_is_skipped() -> None:
    assert action(claim(), storage_class(provisioner="other")) is Action.SKIP


@pytest.mark.parametrize("spec,needle", [
    ({"selector": {"matchLabels": {"a": "b"}}}, "Selector"),
    ({"dataSource": {"kind": "VolumeSnapshot", "name": "s"}}, "VolumeSnapshot"),
])
def test_unsupported_claims_fail_clearly(spec: KubeObject, needle: str) -> None:
    decision = decide(claim(**spec), storage_class(), False, DRIVER)
    assert decision.action is Action.FAIL and needle in decision.reason


def test_deleted_claim_with_our_finalizer_is_cleaned_up() -> None:
    assert action(claim(deleting=True, finalizers=(FINALIZER,))) is Action.CLEANUP
    # ...unless its PV exists: then the PV's reclaim policy decides.
    assert action(claim(deleting=True, finalizers=(FINALIZER,)), pv_exists=True) is Action.RELEASE
    assert action(claim(deleting=True)) is Action.SKIP


def test_protected_claim_bound_elsewhere_is_cleaned_up() -> None:
    c = claim(finalizers=(FINALIZER,), volumeName="pv-static")
    assert action(c) is Action.CLEANUP
    own = claim(uid="u1", finalizers=(FINALIZER,), volumeName="pvc-u1")
    assert action(own) is Action.RELEASE


def test_protected_claim_keeps_provisioning_without_the_annotation() -> None:
    c = claim(provisioner=None, finalizers=(FINALIZER,))
    assert is_candidate(c, DRIVER)
    assert action(c) is Action.PROVISION


def test_legacy_class_annotation_wins() -> None:
    c = claim(storage_class="new", annotations={"volume.beta.kubernetes.io/storage-class": "old"})
    assert storage_class_name(c) == "old"


@pytest.mark.parametrize("c", [
    claim(volumeName="pvc-x"),
    claim(volumeName="pv-static"),
    claim(provisioner=None, volumeName="pvc-x"),
])
def test_a_settled_claim_is_one_decide_skips_whatever_the_cache_says(c: KubeObject) -> None:
    """The handlers keep settled claims out of the queue (no replay at start or resync)."""
    assert settled(c, DRIVER)
    for sc in (storage_class(), WFFC, None):
        for pv_exists in (True, False):
            assert action(c, sc, pv_exists) is Action.SKIP


@pytest.mark.parametrize("c", [
    claim(),  # pending
    claim(volumeName="pvc-x", finalizers=(FINALIZER,)),  # its provisioning finalizer to release
    claim(volumeName="pvc-x", deleting=True),  # a clone source's protection to release, or cleanup
])
def test_claims_with_work_left_are_not_settled(c: KubeObject) -> None:
    assert not settled(c, DRIVER)
