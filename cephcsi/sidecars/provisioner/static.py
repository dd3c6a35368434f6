"""Static (pre-provisioned) PVs of this driver: never deleted, and reclaimPolicy Delete refused with
a Warning event on the PV. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from cephcsi.kube.events import WARNING
from cephcsi.observability.logging import fields
from cephcsi.sidecars import objects
from cephcsi.sidecars.provisioner import names
from cephcsi.sidecars.provisioner.context import ProvisionerContext

log = logging.getLogger(__name__)

STATIC_VOLUME_KEY = "staticVolume"
REASON = "StaticVolumeNotDeleted"
# Go's strconv.ParseBool spellings of true, as ceph-csi reads staticVolume.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})


def is_static_pv(pv: Mapping[str, Any], driver_name: str) -> bool:
    csi = objects.spec(pv).get("csi") or {}
    attributes = csi.get("volumeAttributes") or {}
    return bool(csi.get("driver") == driver_name and attributes.get(STATIC_VOLUME_KEY) in _TRUE)


def message(pv: Mapping[str, Any]) -> str:
    name = objects.name(pv)
    csi = objects.spec(pv).get("csi") or {}
    pool = (csi.get("volumeAttributes") or {}).get("pool", "?")
    return (
        f"PersistentVolume {name} is a static volume (RBD image {pool}/{csi.get('volumeHandle', '?')}): the driver "
        "never deletes a pre-provisioned image, so reclaimPolicy Delete is not honoured and the PV is left as it is. "
        f"Set it to Retain (kubectl patch pv {name} -p "
        "'{\"spec\":{\"persistentVolumeReclaimPolicy\":\"Retain\"}}'), then delete the PV and, if the data is "
        "no longer needed, the image (rbd rm) by hand"
    )


class StaticGuard:
    """Per leadership term: warns once per PV incarnation and phase (resyncs would repeat it)."""

    def __init__(self, ctx: ProvisionerContext) -> None:
        self.ctx = ctx
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def process(self, pv: Mapping[str, Any]) -> None:
        name = objects.name(pv)
        if objects.has_finalizer(pv, names.PV_FINALIZER):
            # Our deletion finalizer guards a DeleteVolume that will never run for this PV.
            self.ctx.api.remove_pv_finalizer(name, names.PV_FINALIZER)
        if objects.spec(pv).get("persistentVolumeReclaimPolicy") != names.RECLAIM_DELETE:
            return
        key = (objects.uid(pv) or name, str(objects.status(pv).get("phase") or ""))
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        text = message(pv)
        self.ctx.events.event(pv, WARNING, REASON, text)
        log.warning("static volume with reclaimPolicy Delete: not deleting its image",
                    extra=fields(pv=name, phase=key[1]))
