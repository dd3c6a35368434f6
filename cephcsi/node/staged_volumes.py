"""Which volumes this driver stages on this node: the kubelet's staging paths of the driver,
and the stage records in them. Read by the passes that act on every staged volume (reclaim
space, the stale-stage sweep at start); RPCs are given their path by the kubelet.

The kubelet's layout: Filesystem volumes at <csi>/<driver>/<sha256>/globalmount since
Kubernetes 1.24 and <csi>/pv/<pv name>/globalmount before; Block volumes at
<csi>/volumeDevices/staging/<pv name>. Where the path does not name the driver, the
vol_data.json the kubelet keeps for the volume does (beside globalmount; in
<csi>/volumeDevices/<pv name>/data for Block).
"""
from __future__ import annotations

import glob
import json
import logging
import os

from cephcsi.errors import CephCSIError
from cephcsi.node import stage_record
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

CSI_DIR = "plugins/kubernetes.io/csi"
LEGACY_DIR = "pv"
BLOCK_DIR = "volumeDevices"
VOL_DATA = "vol_data.json"


def staging_paths(kubelet_dir: str, driver_name: str, block: bool = False) -> list[str]:
    """The staging paths of this driver's Filesystem volumes (and Block volumes with `block`)."""
    root = os.path.join(kubelet_dir, CSI_DIR)
    found = set(glob.glob(os.path.join(glob.escape(os.path.join(root, driver_name)), "*", "globalmount")))
    for path in glob.glob(os.path.join(glob.escape(os.path.join(root, LEGACY_DIR)), "*", "globalmount")):
        if _driver_of(os.path.dirname(path)) == driver_name:
            found.add(path)
    if block:
        devices = os.path.join(root, BLOCK_DIR)
        for path in glob.glob(os.path.join(glob.escape(os.path.join(devices, "staging")), "*")):
            if _driver_of(os.path.join(devices, os.path.basename(path), "data")) == driver_name:
                found.add(path)
    return sorted(found)


def _driver_of(volume_dir: str) -> str:
    """The driverName the kubelet recorded in a volume's vol_data.json ('' when unreadable)."""
    try:
        with open(os.path.join(volume_dir, VOL_DATA), encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return ""
    return str(doc.get("driverName", "")) if isinstance(doc, dict) else ""


def stage_records(kubelet_dir: str, driver_name: str, block: bool, skipped: str) -> list[stage_record.StageRecord]:
    """The stage records in `staging_paths`; an unreadable one is logged with `skipped` (what
    the caller does not do for it) and left out."""
    found = []
    for path in staging_paths(kubelet_dir, driver_name, block):
        try:
            record = stage_record.load(path)
        except CephCSIError as error:
            log.warning("stage record unreadable; left out", extra=fields(path=path, error=error.message,
                                                                          skipped=skipped))
            continue
        if record is not None:
            found.append(record)
    return found
