"""Which claims' volumes are due for the controller's sparsify (pure: objects in, decisions out).

A claim is considered when it is Bound to a PersistentVolume of this driver and a schedule
annotation (cephcsi.volumes.reclaim) applies to it: the claim's own, else its Namespace's, else its
StorageClass's — csi-addons' default order (its `schedule-precedence: pvc`), so a namespace owner
can set a schedule for all their claims without touching a class other namespaces share, and a
claim can still opt for its own. Its next run is the schedule's first time after the run recorded
on the claim, or after its creation.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cephcsi.errors import InvalidArgument
from cephcsi.sidecars import objects
from cephcsi.volumes import reclaim

KubeLookup = Callable[[str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class Due:
    claim_key: str
    """namespace/name."""
    volume_id: str
    pv: Mapping[str, Any]
    claim: Mapping[str, Any]
    storage_class: Mapping[str, Any]
    schedule: str


@dataclass(frozen=True)
class Refused:
    claim_key: str
    claim: Mapping[str, Any]
    schedule: str
    reason: str


def schedule_text(claim: Mapping[str, str], namespace: Mapping[str, str], storage_class: Mapping[str, str]) -> str:
    """The schedule that applies ('' for none): the first of claim, namespace, class that has a
    non-blank schedule annotation."""
    for annotations in (claim, namespace, storage_class):
        text = (annotations.get(reclaim.SCHEDULE_ANNOTATION) or "").strip()
        if text:
            return text
    return ""


def decide(claim: Mapping[str, Any], driver: str, volume_of: KubeLookup, class_of: KubeLookup,
           now: datetime, namespace_of: KubeLookup | None = lambda name: None) -> Due | Refused | None:
    """Due, Refused (a schedule that cannot be read) or None (nothing to do now). `namespace_of`
    looks a Namespace up by name (it returns None: no such Namespace, no schedule from it); None
    when the Namespaces are not known yet: then only the claim's own schedule counts, as its
    Namespace's, if any, would override its class's."""
    if objects.status(claim).get("phase") != "Bound" or objects.deleting(claim):
        return None
    pv = volume_of(str(objects.spec(claim).get("volumeName") or ""))
    csi = (objects.spec(pv).get("csi") or {}) if pv else {}
    if not pv or csi.get("driver") != driver or not csi.get("volumeHandle"):
        return None
    class_name = str(objects.spec(claim).get("storageClassName") or "")
    storage_class = (class_of(class_name) if class_name else None) or {}
    annotations = dict(objects.annotations_of(claim))
    if namespace_of is None:
        text = schedule_text(annotations, {}, {})
    else:
        namespace = namespace_of(objects.namespace(claim)) or {}
        text = schedule_text(annotations, dict(objects.annotations_of(namespace)),
                             dict(objects.annotations_of(storage_class)))
    if not text:
        return None
    try:
        schedule = reclaim.parse_schedule(text)
    except InvalidArgument as error:
        return Refused(objects.key(claim), claim, text, error.message)
    created = reclaim.parse_time(str(objects.meta(claim).get("creationTimestamp") or "")) or now
    last = reclaim.parse_time(annotations.get(reclaim.LAST_RUN_ANNOTATION, ""))
    if not reclaim.is_due(schedule, last, created, now):
        return None
    return Due(objects.key(claim), str(csi["volumeHandle"]), pv, claim, storage_class, text)
