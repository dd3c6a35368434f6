"""The annotation, finalizer and parameter names the provisioner shares with Kubernetes and with
external-provisioner (so PVs written by either are handled by the other)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cephcsi.sidecars import objects

# PVC annotations written by the PV controller (binder) and the scheduler.
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"

# PV annotations and finalizer written by the provisioner.
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_MIGRATED_TO = "pv.kubernetes.io/migrated-to"
ANN_DELETION_SECRET_NAME = "volume.kubernetes.io/provisioner-deletion-secret-name"
ANN_DELETION_SECRET_NAMESPACE = "volume.kubernetes.io/provisioner-deletion-secret-namespace"
# external-provisioner >= 6.1: the StorageClass's controller-modify secret, read by the resizer.
ANN_MODIFY_SECRET_NAME = "volume.kubernetes.io/controller-modify-secret-name"
ANN_MODIFY_SECRET_NAMESPACE = "volume.kubernetes.io/controller-modify-secret-namespace"
PV_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
PROVISIONER_IDENTITY_KEY = "storage.kubernetes.io/csiProvisionerIdentity"

# StorageClass parameters reserved for Kubernetes (stripped before CreateVolume).
RESERVED_PREFIX = "csi.storage.k8s.io/"
FSTYPE_KEY = RESERVED_PREFIX + "fstype"
PVC_NAME_KEY = RESERVED_PREFIX + "pvc/name"
PVC_NAMESPACE_KEY = RESERVED_PREFIX + "pvc/namespace"
PV_NAME_KEY = RESERVED_PREFIX + "pv/name"

BINDING_WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
RECLAIM_DELETE = "Delete"


def provisioning_finalizer(driver_name: str) -> str:
    """The PVC finalizer that makes an in-progress provisioning durable (see provision.py).

    Qualified by the driver name, so two driver instances never touch each other's claims."""
    return f"{driver_name}/provisioning"


def volume_name(claim_uid: str) -> str:
    """The CreateVolume name and PV name for a claim (external-provisioner's `pvc-<uid>`)."""
    return f"pvc-{claim_uid}"


def storage_class_name(claim: Mapping[str, Any]) -> str:
    """The claim's class: the legacy beta annotation wins over spec.storageClassName, as in
    Kubernetes' own GetPersistentVolumeClaimClass."""
    legacy = objects.annotations_of(claim).get(ANN_BETA_STORAGE_CLASS)
    if legacy is not None:
        return legacy
    return str(objects.spec(claim).get("storageClassName") or "")
