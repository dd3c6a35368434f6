"""What an informer's cache keeps of each object, and how compactly (issue 38). Applied by the
reflector to every listed object and watch event: fields no loop reads and that can be large
are dropped (managedFields, the last-applied-configuration annotation, a Node's status.images),
and equal pieces at known places are replaced by one shared copy from per-informer, capped
pools. Safe because cached objects are read-only. Reasoning: docs/design/kubernetes-machinery.md."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cephcsi.kube.store import KubeObject

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

POOL_CAP = 4096
"""Entries each pool of one informer holds at most; past it new values are kept as they are."""

_Scalar = (str, bool, int, float, type(None))


class Projection:
    """The drop-and-share step of one informer (its pools live as long as it does). Not
    thread-safe: only the informer's watch thread calls it."""

    def __init__(self, cap: int = POOL_CAP) -> None:
        self.cap = cap
        self._texts: dict[str, str] = {}
        self._containers: dict[tuple[Any, ...], Any] = {}
        self._recent: dict[str, str] = {}
        self._kinds: dict[str, Callable[[KubeObject], None]] = {
            "PersistentVolumeClaim": self._claim,
            "PersistentVolume": self._volume,
            "VolumeAttachment": self._attachment,
            "Node": self._node,
        }

    def __call__(self, obj: Any) -> None:
        """Drop and share in place (anything but a dict with a dict `metadata` is left alone)."""
        if not isinstance(obj, dict):
            return
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            del annotations[LAST_APPLIED]
        self._text_at(obj, "kind")
        self._text_at(obj, "apiVersion")
        self._text_at(meta, "namespace")
        self._recent_at(meta, "creationTimestamp")
        for field in ("annotations", "labels", "finalizers"):
            self._shared_at(meta, field)
        per_kind = self._kinds.get(str(obj.get("kind") or ""))
        if per_kind is not None:
            per_kind(obj)

    # ---- per kind ------------------------------------------------------------------------------

    def _claim(self, obj: KubeObject) -> None:
        spec = _dict(obj, "spec")
        if spec is not None:
            for field in ("storageClassName", "volumeMode", "volumeAttributesClassName"):
                self._text_at(spec, field)
            for field in ("accessModes", "resources", "selector", "dataSource", "dataSourceRef"):
                self._shared_at(spec, field)
        self._shared_at(obj, "status")

    def _volume(self, obj: KubeObject) -> None:
        spec = _dict(obj, "spec")
        if spec is not None:
            for field in ("storageClassName", "volumeMode", "persistentVolumeReclaimPolicy",
                          "volumeAttributesClassName"):
                self._text_at(spec, field)
            for field in ("accessModes", "capacity", "mountOptions", "nodeAffinity"):
                self._shared_at(spec, field)
            ref = _dict(spec, "claimRef")
            if ref is not None:
                for field in ("apiVersion", "kind", "namespace"):
                    self._text_at(ref, field)
            csi = _dict(spec, "csi")
            if csi is not None:
                self._text_at(csi, "driver")
                self._text_at(csi, "fsType")
                for field in ("nodeStageSecretRef", "nodePublishSecretRef", "controllerPublishSecretRef",
                              "controllerExpandSecretRef", "nodeExpandSecretRef"):
                    self._shared_at(csi, field)
                attributes = _dict(csi, "volumeAttributes")
                if attributes is not None:
                    for key, value in attributes.items():
                        if isinstance(value, str):
                            attributes[key] = self._recent_text("volumeAttributes/" + key, value)
        status = _dict(obj, "status")
        if status is not None:
            self._text_at(status, "phase")
            self._recent_at(status, "lastPhaseTransitionTime")
            if "lastPhaseTransitionTime" not in status:
                # With its per-volume time a status never repeats: pooling it would only fill the
                # capped pool with entries no other object shares.
                self._shared_at(obj, "status")

    def _attachment(self, obj: KubeObject) -> None:
        spec = _dict(obj, "spec")
        if spec is not None:
            self._text_at(spec, "attacher")
            self._text_at(spec, "nodeName")
        self._shared_at(obj, "status")

    def _node(self, obj: KubeObject) -> None:
        status = _dict(obj, "status")
        if status is not None:
            status.pop("images", None)

    # ---- pools ------------------------------------------------------------------------------------

    def text(self, value: str) -> str:
        """The pooled copy of a string (itself when new and the pool is full)."""
        found = self._texts.get(value)
        if found is not None:
            return found
        if len(self._texts) < self.cap:
            self._texts[value] = value
        return value

    def shared(self, value: Any) -> Any:
        """The pooled copy of a JSON value, shared bottom-up: an equal list or dict already
        pooled is returned instead of `value` (built of the same types in the same order)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(v, _Scalar) or isinstance(v, str):
                    value[k] = self.shared(v)
            key: tuple[Any, ...] = ("d",) + tuple((k, _identity(v)) for k, v in value.items())
        elif isinstance(value, list):
            for i, v in enumerate(value):
                if not isinstance(v, _Scalar) or isinstance(v, str):
                    value[i] = self.shared(v)
            key = ("l",) + tuple(_identity(v) for v in value)
        else:
            return value
        found = self._containers.get(key)
        if found is not None:
            return found
        if len(self._containers) < self.cap:
            self._containers[key] = value
        return value

    def _text_at(self, parent: dict[str, Any], field: str) -> None:
        value = parent.get(field)
        if isinstance(value, str):
            parent[field] = self.text(value)

    def _shared_at(self, parent: dict[str, Any], field: str) -> None:
        value = parent.get(field)
        if isinstance(value, (dict, list)):
            parent[field] = self.shared(value)

    def _recent_text(self, where: str, value: str) -> str:
        last = self._recent.get(where)
        if last == value:
            return last
        self._recent[where] = value
        return value

    def _recent_at(self, parent: dict[str, Any], field: str) -> None:
        value = parent.get(field)
        if isinstance(value, str):
            parent[field] = self._recent_text(field, value)


def _dict(parent: dict[str, Any], field: str) -> dict[str, Any] | None:
    value = parent.get(field)
    return value if isinstance(value, dict) else None


def _identity(value: Any) -> Any:
    """What a pooled container's key holds for one of its values: a scalar by type and value
    (True and 1 are equal in Python, not in JSON), a container already pooled by identity (the
    pool keeps it alive, so its id is not reused while the key exists)."""
    if isinstance(value, (dict, list)):
        return ("o", id(value))
    return (type(value).__name__, value)
