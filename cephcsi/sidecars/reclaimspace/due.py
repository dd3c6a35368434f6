"""Which claims' volumes are due for the controller's sparsify (pure: objects in, decisions out).

A claim is considered when it is Bound to a PersistentVolume of this driver and it, or its
StorageClass, carries the schedule annotation (cephcsi.volumes.reclaim). Its next run is the
schedule's first time after the run recorded on the claim, or after its creation.
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


def decide(claim: Mapping[str, Any], driver: str, volume_of: KubeLookup, class_of: KubeLookup,
           now: datetime) -> Due | Refused | None:
    """Due, Refused (a schedule that cannot be read) or None (nothing to do now)."""
    if objects.status(claim).get("phase") != "Bound" or objects.deleting(claim):
        return None
    pv = volume_of(str(objects.spec(claim).get("volumeName") or ""))
    csi = (objects.spec(pv).get("csi") or {}) if pv else {}
    if not pv or csi.get("driver") != driver or not csi.get("volumeHandle"):
        return None
    class_name = str(objects.spec(claim).get("storageClassName") or "")
    storage_class = (class_of(class_name) if class_name else None) or {}
    annotations = dict(objects.annotations_of(claim))
    text = reclaim.schedule_of(annotations, dict(objects.annotations_of(storage_class)))
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
