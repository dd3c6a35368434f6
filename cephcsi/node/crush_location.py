"""This node's CRUSH location for config.json's readAffinity, from its Node's labels.

ceph-csi reads the labels once when its node plugin starts. Here they are read through the
same reader as the topology labels (topology.KubeNodeLabels) on the first krbd map of a
cluster with readAffinity on, and kept for `ttl` seconds: a burst of stages makes one API
call, and a relabelled node is picked up without a restart. A failed refresh falls back to
the last labels read; with none read yet the stage fails UNAVAILABLE (the kubelet retries)
rather than mapping for good without the locality the cluster's configuration asks for.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from cephcsi.config.read_affinity import ReadAffinity
from cephcsi.errors import CephCSIError
from cephcsi.node.mappers.read_affinity import CrushLocation, crush_location
from cephcsi.node.topology import NodeLabels
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

LABELS_TTL = 300.0


class CrushLocator:
    def __init__(self, source: NodeLabels, node_name: str, ttl: float = LABELS_TTL,
                 clock: Callable[[], float] = time.monotonic, fallback_labels: tuple[str, ...] = ()) -> None:
        self.source = source
        self.fallback_labels = fallback_labels
        """--crush-location-labels (with --enable-read-affinity): for entries enabled without labels."""
        self.node_name = node_name
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._labels: Mapping[str, str] | None = None
        self._read_at = 0.0
        self._unlocated: set[tuple[str, ...]] = set()

    def _node_labels(self) -> Mapping[str, str]:
        with self._lock:  # one API call for concurrent stages; nothing else waits on it
            if self._labels is not None and self.clock() - self._read_at < self.ttl:
                return self._labels
            try:
                labels = dict(self.source.labels(self.node_name))
            except CephCSIError as error:
                if self._labels is None:
                    raise
                log.warning("cannot refresh the node labels for readAffinity; using the last ones read",
                            extra=fields(node=self.node_name, error=str(error)))
                return self._labels
            self._labels, self._read_at = labels, self.clock()
            return labels

    def location(self, affinity: ReadAffinity) -> CrushLocation:
        """The (type, value) pairs to map with, or () when read affinity is off or the node
        carries none of the labels (said once per label list)."""
        labels = affinity.crush_location_labels or self.fallback_labels
        if not affinity.enabled or not labels:
            return ()
        found = crush_location(labels, self._node_labels())
        if not found and labels not in self._unlocated:
            self._unlocated.add(labels)
            log.warning("readAffinity is on but this node has none of its crushLocationLabels: "
                        "mapping without read_from_replica=localize",
                        extra=fields(node=self.node_name, labels=",".join(labels)))
        return found
