"""config.json's per-cluster `readAffinity`, as ceph-csi (≥ 3.10) reads it: whether krbd maps that
cluster's images with `read_from_replica=localize`, and from which Node labels the CRUSH location
comes (the node flags only fill in an enabled entry's empty label list). Design:
docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cephcsi.errors import ConfigError

log = logging.getLogger(__name__)

KEY = "readAffinity"
ENABLED = "enabled"
LABELS = "crushLocationLabels"
KNOWN = frozenset({ENABLED, LABELS})

_warned: set[str] = set()


@dataclass(frozen=True)
class ReadAffinity:
    enabled: bool = False
    crush_location_labels: tuple[str, ...] = ()
    """Node label keys, in config order; the first label giving a CRUSH type wins."""

    @property
    def active(self) -> bool:
        """Whether maps of this cluster get read-affinity options at all."""
        return self.enabled and bool(self.crush_location_labels)


DISABLED = ReadAffinity()


def parse(entry: Mapping[str, Any], where: str) -> ReadAffinity:
    """The `readAffinity` of one config.json entry; DISABLED when absent or null. Wrong types
    are a ConfigError (ceph-csi's JSON decoding refuses them too), so a typo such as
    `"enabled": "true"` keeps the last good configuration instead of silently turning it off."""
    raw = entry.get(KEY)
    if raw is None:
        return DISABLED
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: {KEY} must be an object")
    enabled = raw.get(ENABLED, False)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: {KEY}.{ENABLED} must be true or false, got {enabled!r}")
    labels = raw.get(LABELS) or []
    if not isinstance(labels, list) or not all(isinstance(label, str) and label.strip() for label in labels):
        raise ConfigError(f"{where}: {KEY}.{LABELS} must be a list of Node label keys")
    return ReadAffinity(enabled, tuple(label.strip() for label in labels))


def note_inactive(affinity: ReadAffinity, cluster_id: str, source: str) -> None:
    """Say once per cluster that `enabled: true` without labels depends on the node plugin's
    --enable-read-affinity --crush-location-labels (without them: no read affinity)."""
    if not affinity.enabled or affinity.crush_location_labels or cluster_id in _warned:
        return
    _warned.add(cluster_id)
    log.info(
        "readAffinity is enabled without crushLocationLabels: the node plugin's --crush-location-labels apply",
        extra={"fields": {"source": source, "cluster_id": cluster_id,
                          "reason": "without --enable-read-affinity --crush-location-labels on the node plugin this "
                                    "cluster maps without read affinity; or list the labels in "
                                    "readAffinity.crushLocationLabels"}},
    )
