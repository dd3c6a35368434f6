"""config.json: the Ceph clusters the driver may talk to, in ceph-csi's format.

    [{"clusterID": "c1", "monitors": ["10.0.0.1:6789", ...], "rbd": {"radosNamespace": ""},
      "readAffinity": {"enabled": true, "crushLocationLabels": ["topology.kubernetes.io/zone"]}}]

The file is usually a mounted ConfigMap, which the kubelet updates in place; it is re-read when
its modification time changes, so adding a cluster needs no restart.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass

from cephcsi.config import ignored, read_affinity
from cephcsi.config.read_affinity import ReadAffinity
from cephcsi.errors import ConfigError, InvalidArgument, NotFound

log = logging.getLogger(__name__)

# clusterID is embedded in volume ids: keep it to characters that are safe there and in paths.
CLUSTER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,35}$")


@dataclass(frozen=True)
class ClusterConfig:
    cluster_id: str
    monitors: tuple[str, ...]
    """Monitor addresses as written in config.json: `host:port` or `[v2:...,v1:...]`."""
    rados_namespace: str = ""
    read_affinity: ReadAffinity = read_affinity.DISABLED
    """Per-cluster readAffinity (krbd reads from the nearest replica); see config/read_affinity.py."""

    @property
    def mon_host(self) -> str:
        """The value for librados' `mon_host`."""
        return ",".join(self.monitors)


def parse_clusters(text: str, source: str = "config.json") -> dict[str, ClusterConfig]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source} is not valid JSON: {error}") from None
    if not isinstance(doc, list):
        raise ConfigError(f"{source} must be a JSON list of cluster entries")
    clusters: dict[str, ClusterConfig] = {}
    for index, entry in enumerate(doc):
        where = f"{source} entry {index}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be an object")
        cluster_id = entry.get("clusterID")
        if not isinstance(cluster_id, str) or not CLUSTER_ID_PATTERN.match(cluster_id):
            raise ConfigError(
                f"{where}: clusterID must be 1-36 characters of letters, digits, '.', '_' or '-'; got {cluster_id!r}"
            )
        monitors = entry.get("monitors")
        if not isinstance(monitors, list) or not monitors or not all(isinstance(m, str) and m for m in monitors):
            raise ConfigError(f"{where} ({cluster_id}): monitors must be a non-empty list of 'host:port' strings")
        rbd = entry.get("rbd") or {}
        if not isinstance(rbd, dict):
            raise ConfigError(f"{where} ({cluster_id}): rbd must be an object")
        namespace = rbd.get("radosNamespace", "") or ""
        if not isinstance(namespace, str):
            raise ConfigError(f"{where} ({cluster_id}): rbd.radosNamespace must be a string")
        if cluster_id in clusters:
            raise ConfigError(f"{where}: clusterID {cluster_id!r} appears twice")
        affinity = read_affinity.parse(entry, f"{where} ({cluster_id})")
        clusters[cluster_id] = ClusterConfig(cluster_id, tuple(monitors), namespace, affinity)
        ignored.report(entry, cluster_id, source)  # ceph-csi keys not implemented here, and typos
        read_affinity.note_inactive(affinity, cluster_id, source)
    return clusters


class ClusterRegistry:
    """Looks clusters up by id, re-reading the file when it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._bad_stamp: tuple[int, int] | None = None
        self._clusters: dict[str, ClusterConfig] = {}
        self.reload()

    def reload(self) -> None:
        try:
            stat = os.stat(self.path)
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as error:
            raise ConfigError(f"cannot read cluster config {self.path}: {error.strerror}") from None
        clusters = parse_clusters(text, self.path)
        with self._lock:
            self._clusters = clusters
            self._stamp = (stat.st_mtime_ns, stat.st_size)

    def _refresh(self) -> None:
        try:
            stat = os.stat(self.path)
        except OSError:
            return  # keep the last good config while a ConfigMap update swaps the file
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            try:
                self.reload()
            except ConfigError as error:
                # A half-written update, or a broken edit: keep serving with the last good clusters.
                if stamp != self._bad_stamp:
                    self._bad_stamp = stamp
                    log.error("config file is malformed; keeping the last good configuration",
                              extra={"fields": {"path": self.path, "error": error.message,
                                                 "clusters": ",".join(sorted(self._clusters))}})

    def get(self, cluster_id: str) -> ClusterConfig:
        if not cluster_id:
            raise InvalidArgument("parameter clusterID is required (the clusterID of an entry in config.json)")
        self._refresh()
        with self._lock:
            cluster = self._clusters.get(cluster_id)
            known = sorted(self._clusters)
        if cluster is None:
            raise NotFound(f"clusterID {cluster_id!r} is not in {self.path} (known: {', '.join(known) or 'none'})")
        return cluster

    def ids(self) -> list[str]:
        self._refresh()
        with self._lock:
            return sorted(self._clusters)
