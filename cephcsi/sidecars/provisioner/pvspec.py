"""The PersistentVolume for a provisioned volume, field for field as external-provisioner writes it
(pure). Design: docs/design/sidecars.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.sidecars import objects
from cephcsi.sidecars.provisioner import names, secrets
from cephcsi.sidecars.provisioner.names import storage_class_name
from cephcsi.sidecars.provisioner.request import PlannedVolume, format_bytes
from cephcsi.sidecars.provisioner.topology import node_affinity


@dataclass(frozen=True)
class PVOptions:
    driver_name: str
    provisioner_identity: str
    """storage.kubernetes.io/csiProvisionerIdentity: `<ms since epoch>-<random>-<driver>`, one per
    process, as external-provisioner generates it."""
    topology: bool = False


@dataclass(frozen=True)
class ClassSecrets:
    """The class's secret references resolved for one claim (None: not set)."""

    refs: dict[str, secrets.SecretRef | None] = field(default_factory=dict)

    def get(self, kind: str) -> secrets.SecretRef | None:
        return self.refs.get(kind)

    @classmethod
    def resolve(cls, parameters: Mapping[str, str], pv_name: str, claim: Mapping[str, Any]) -> ClassSecrets:
        return cls({kind: secrets.secret_ref(kind, parameters, pv_name, claim) for kind in secrets.KINDS})


def claim_ref(claim: Mapping[str, Any]) -> dict[str, str]:
    return {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": objects.namespace(claim),
        "name": objects.name(claim),
        "uid": objects.uid(claim),
        "resourceVersion": str(objects.meta(claim).get("resourceVersion") or ""),
    }


def reclaim_policy(storage_class: Mapping[str, Any]) -> str:
    return str(storage_class.get("reclaimPolicy") or names.RECLAIM_DELETE)


def build(claim: Mapping[str, Any], storage_class: Mapping[str, Any], planned: PlannedVolume,
          volume: csi_pb2.Volume, class_secrets: ClassSecrets, options: PVOptions) -> dict[str, Any]:
    policy = reclaim_policy(storage_class)
    capacity = volume.capacity_bytes or planned.required_bytes
    annotations = {names.ANN_PROVISIONED_BY: options.driver_name}
    provisioner_secret = class_secrets.get(secrets.PROVISIONER)
    if provisioner_secret is not None:
        annotations[names.ANN_DELETION_SECRET_NAME] = provisioner_secret.name
        annotations[names.ANN_DELETION_SECRET_NAMESPACE] = provisioner_secret.namespace
    modify_secret = class_secrets.get(secrets.CONTROLLER_MODIFY)
    if modify_secret is not None:
        annotations[names.ANN_MODIFY_SECRET_NAME] = modify_secret.name
        annotations[names.ANN_MODIFY_SECRET_NAMESPACE] = modify_secret.namespace
    csi: dict[str, Any] = {
        "driver": options.driver_name,
        "volumeHandle": volume.volume_id,
        "volumeAttributes": {names.PROVISIONER_IDENTITY_KEY: options.provisioner_identity, **dict(volume.volume_context)},
    }
    if not planned.block:
        csi["fsType"] = planned.fs_type
    for kind, field_name in ((secrets.CONTROLLER_PUBLISH, "controllerPublishSecretRef"),
                             (secrets.NODE_STAGE, "nodeStageSecretRef"),
                             (secrets.NODE_PUBLISH, "nodePublishSecretRef"),
                             (secrets.CONTROLLER_EXPAND, "controllerExpandSecretRef"),
                             (secrets.NODE_EXPAND, "nodeExpandSecretRef")):
        ref = class_secrets.get(kind)
        if ref is not None:
            csi[field_name] = ref.to_api()
    spec: dict[str, Any] = {
        "accessModes": list(planned.access_modes),
        "capacity": {"storage": format_bytes(capacity)},
        "csi": csi,
        "claimRef": claim_ref(claim),
        "persistentVolumeReclaimPolicy": policy,
        "storageClassName": storage_class_name(claim),
        "volumeMode": "Block" if planned.block else "Filesystem",
    }
    if planned.mount_options:
        spec["mountOptions"] = list(planned.mount_options)
    vac = str(objects.spec(claim).get("volumeAttributesClassName") or "")
    if vac:
        # The PV binder copies it to the claim's status.currentVolumeAttributesClassName.
        spec["volumeAttributesClassName"] = vac
    if options.topology:
        affinity = node_affinity(volume.accessible_topology)
        if affinity is not None:
            spec["nodeAffinity"] = affinity
    metadata: dict[str, Any] = {"name": planned.name, "annotations": annotations}
    if policy == names.RECLAIM_DELETE:
        metadata["finalizers"] = [names.PV_FINALIZER]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": metadata, "spec": spec}
