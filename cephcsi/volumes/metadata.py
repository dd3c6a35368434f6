"""Kubernetes owner metadata of a volume's image, with ceph-csi's key names.

With `--extra-create-metadata` (external-provisioner's flag, which ceph-csi's deployments set)
CreateVolume parameters carry the claim's name and namespace and the PV's name under the
reserved `csi.storage.k8s.io/` prefix. ceph-csi stores exactly these keys, with these names, as
RBD image metadata (internal/util/k8s/parameters.go), so `rbd image-meta list <image>` and
`cephcsi audit` can tell which claim an image belongs to — the same for images either driver made.
"""
from __future__ import annotations

from collections.abc import Mapping

PVC_NAME_KEY = "csi.storage.k8s.io/pvc/name"
PVC_NAMESPACE_KEY = "csi.storage.k8s.io/pvc/namespace"
PV_NAME_KEY = "csi.storage.k8s.io/pv/name"
KEYS = (PVC_NAME_KEY, PVC_NAMESPACE_KEY, PV_NAME_KEY)


def from_parameters(parameters: Mapping[str, str]) -> dict[str, str]:
    """The owner keys present (and non-empty) in CreateVolume parameters."""
    return {key: parameters[key] for key in KEYS if parameters.get(key)}


def owner(metadata: Mapping[str, str]) -> str:
    """"namespace/claim (pv)" for reports; '' when the image carries no owner keys."""
    claim = metadata.get(PVC_NAME_KEY, "")
    namespace = metadata.get(PVC_NAMESPACE_KEY, "")
    pv = metadata.get(PV_NAME_KEY, "")
    text = f"{namespace}/{claim}" if claim else ""
    if pv:
        text = f"{text} ({pv})" if text else pv
    return text
