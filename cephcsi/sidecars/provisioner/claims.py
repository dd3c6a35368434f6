"""Claim selection: what the provisioner should do with one PVC, decided from cached objects (pure;
external-provisioner's shouldProvision plus the provisioning finalizer). The worker re-checks
anything destructive against the apiserver. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cephcsi.sidecars import objects
from cephcsi.sidecars.provisioner import datasource, names


class Action(enum.Enum):
    PROVISION = "provision"
    """Create the volume and its PV."""
    RELEASE = "release"
    """The PV exists: only drop our provisioning finalizer."""
    CLEANUP = "cleanup"
    """The claim is going away (or bound elsewhere) while its volume may exist: delete the
    volume, then drop the finalizer."""
    SKIP = "skip"
    """Nothing to do (not ours, already done, or waiting for the scheduler)."""
    FAIL = "fail"
    """Ours, but the claim asks for something we cannot do; report it."""


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def requested_provisioner(claim: Mapping[str, Any]) -> str:
    annotations = objects.annotations_of(claim)
    return annotations.get(names.ANN_STORAGE_PROVISIONER) or annotations.get(names.ANN_BETA_STORAGE_PROVISIONER) or ""


def selected_node(claim: Mapping[str, Any]) -> str:
    return objects.annotations_of(claim).get(names.ANN_SELECTED_NODE) or ""


def waits_for_consumer(storage_class: Mapping[str, Any] | None) -> bool:
    if not storage_class:  # no class (or an empty one): Immediate binding
        return False
    return storage_class.get("volumeBindingMode") == names.BINDING_WAIT_FOR_FIRST_CONSUMER


def is_candidate(claim: Mapping[str, Any], driver_name: str) -> bool:
    """Cheap filter for the informer handler: could this claim ever need us?"""
    return requested_provisioner(claim) == driver_name or objects.has_finalizer(
        claim, names.provisioning_finalizer(driver_name)
    )


def settled(claim: Mapping[str, Any], driver_name: str) -> bool:
    """The claim needs nothing from the worker: bound, not being deleted, no provisioning
    finalizer (decide() says SKIP and there is no clone protection to release). The handlers
    leave such claims out of the queue, so a start or a resync over thousands of bound claims
    costs no worker round trips; any change that could need work (deletion, a finalizer) comes
    as an update that fails this test."""
    return (not objects.deleting(claim) and bool(objects.spec(claim).get("volumeName"))
            and not objects.has_finalizer(claim, names.provisioning_finalizer(driver_name)))


def decide(claim: Mapping[str, Any], storage_class: Mapping[str, Any] | None, pv_exists: bool,
           driver_name: str) -> Decision:
    """What to do with `claim`; `pv_exists` tells whether PV pvc-<uid> is in the cache."""
    protected = objects.has_finalizer(claim, names.provisioning_finalizer(driver_name))
    ours = requested_provisioner(claim) == driver_name
    own_pv = names.volume_name(objects.uid(claim))
    bound_to = str(objects.spec(claim).get("volumeName") or "")
    if objects.deleting(claim):
        if not protected:
            return Decision(Action.SKIP, "claim is being deleted")
        if pv_exists:
            return Decision(Action.RELEASE, "claim is being deleted and its PV exists; the PV's reclaim policy applies")
        return Decision(Action.CLEANUP, "claim was deleted before its PV was created")
    if pv_exists or bound_to == own_pv:
        if protected:
            return Decision(Action.RELEASE, f"PV {own_pv} exists")
        return Decision(Action.SKIP, f"PV {own_pv} exists; the PV controller binds it")
    if bound_to:
        if protected:
            return Decision(Action.CLEANUP, f"claim is bound to {bound_to}, not to the volume provisioned for it")
        return Decision(Action.SKIP, f"claim is bound to {bound_to}")
    if not (ours or protected):
        return Decision(Action.SKIP, "claim is not for this driver")
    if storage_class is None:
        return Decision(Action.FAIL, f'storageclass.storage.k8s.io "{names.storage_class_name(claim)}" not found')
    if storage_class.get("provisioner") != driver_name:
        # The class changed provisioner after the claim was annotated. A protected claim keeps
        # its finalizer, so deleting it still cleans up whatever was created.
        return Decision(Action.SKIP, f"StorageClass provisioner is {storage_class.get('provisioner')!r}")
    if waits_for_consumer(storage_class) and not selected_node(claim):
        # Also for protected claims: after a RESOURCE_EXHAUSTED reschedule the scheduler must
        # pick a node again before we retry (external-provisioner's ProvisioningReschedule).
        return Decision(Action.SKIP, "WaitForFirstConsumer: no node selected yet")
    if objects.spec(claim).get("selector"):
        return Decision(Action.FAIL, "claim Selector is not supported")
    source = datasource.source_of(claim)
    reason = datasource.unsupported(source) if source is not None else None
    if reason:
        return Decision(Action.FAIL, reason)
    return Decision(Action.PROVISION, "claim is pending and ours")
