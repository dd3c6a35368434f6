"""config.json keys ceph-csi knows that cephcsi does not implement, and why; and unknown keys.

ceph-csi's per-cluster entry (internal/util/csiconfig.go ClusterInfo) has more than cephcsi uses.
Silently ignoring them would let a setting someone relies on vanish at the switch, so each one
is named once per process at load, with the reason, as are keys neither driver knows (typos).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any


log = logging.getLogger(__name__)

USED = frozenset({"clusterID", "monitors", "rbd", "readAffinity"})
USED_RBD = frozenset({"radosNamespace"})
USED_READ_AFFINITY = frozenset({"enabled", "crushLocationLabels"})
# key → why it does not apply (ignored: the driver behaves as if it were absent)
IGNORED = {
    "cephFS": "cephcsi is an RBD driver only; CephFS settings belong to ceph-csi's CephFS plugin",
    "nfs": "cephcsi is an RBD driver only; NFS settings belong to ceph-csi's NFS plugin",
}
IGNORED_RBD = {
    "netNamespaceFilePath": "not implemented: the node plugin maps in its own network namespace (hostNetwork)",
    "mirrorDaemonCount": "not implemented: cephcsi does not manage RBD mirroring",
}

_reported: set[tuple[str, str]] = set()


def report(entry: Mapping[str, Any], cluster_id: str, source: str) -> None:
    """Log each ignored or unknown key of one config.json entry, once per process."""
    notes: list[tuple[str, str]] = []
    for key in entry:
        if key not in USED:
            notes.append((key, IGNORED.get(key, "unknown key (not a ceph-csi config.json key either; a typo?)")))
    rbd = entry.get("rbd")
    if isinstance(rbd, dict):
        for key in rbd:
            if key not in USED_RBD:
                notes.append((f"rbd.{key}", IGNORED_RBD.get(key, "unknown key under rbd (a typo?)")))
    affinity = entry.get("readAffinity")
    if isinstance(affinity, dict):
        notes.extend((f"readAffinity.{key}", "unknown key under readAffinity (a typo?)")
                     for key in affinity if key not in USED_READ_AFFINITY)
    for key, reason in notes:
        if (cluster_id, key) in _reported:
            continue
        _reported.add((cluster_id, key))
        log.warning("config.json key ignored",
                    extra={"fields": {"source": source, "cluster_id": cluster_id, "key": key, "reason": reason}})
