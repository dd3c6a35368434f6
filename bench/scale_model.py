"""Pure figures of the `scale` section: object bodies of a seeded cluster, when a Go sidecar's
informers synced (from its klog lines), and growth per 1,000 claims between two cluster sizes.

No I/O here, so the unit tests can pin each rule down."""
from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.stats import Spread, percentile, spread

DRIVER = "rbd.csi.ceph.com"
PV_PROVISIONER_FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"
NODES = 50
"""Nodes of the seeded cluster; attachment i is on node i mod NODES."""

# ---- seeded objects ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    """What every seeded object shares: the namespace of the claims, the class, the secret, the
    Ceph parameters a provisioned PV carries, and the attacher's finalizer (the shape the
    controller leaves behind once it attached a volume, so a steady-state start writes nothing)."""

    namespace: str
    storage_class: str
    secret: tuple[str, str]
    cluster_id: str
    pool: str
    attacher_finalizer: str


def claim_name(i: int) -> str:
    return f"scale-{i:06d}"


def node_name(i: int) -> str:
    return f"scale-node-{i % NODES:02d}"


def pv_name(i: int) -> str:
    # As the provisioner names it: pvc-<claim uid>; a fixed pattern is enough (nothing reads the uid from it).
    return f"pvc-scale-{i:06d}"


def volume_handle(seed: Seed, i: int) -> str:
    """A ceph-csi style volume id (version, cluster id length, cluster id, pool id, object uuid)."""
    return f"0001-{len(seed.cluster_id):04x}-{seed.cluster_id}-0000000000000002-{i:08x}-0000-4000-8000-{i:012x}"


def pvc_body(seed: Seed, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_name(i), "namespace": seed.namespace,
                     "annotations": {"pv.kubernetes.io/bind-completed": "yes",
                                     "pv.kubernetes.io/bound-by-controller": "yes",
                                     "volume.beta.kubernetes.io/storage-provisioner": DRIVER,
                                     "volume.kubernetes.io/storage-provisioner": DRIVER},
                     "finalizers": ["kubernetes.io/pvc-protection"]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": seed.storage_class, "volumeMode": "Filesystem", "volumeName": pv_name(i)},
    }


def pvc_status() -> dict[str, Any]:
    return {"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}}


def pv_body(seed: Seed, i: int, claim_uid: str) -> dict[str, Any]:
    secret_namespace, secret_name = seed.secret
    ref = {"name": secret_name, "namespace": secret_namespace}
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name(i),
                     "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER,
                                     "volume.kubernetes.io/provisioner-deletion-secret-name": secret_name,
                                     "volume.kubernetes.io/provisioner-deletion-secret-namespace": secret_namespace},
                     "finalizers": ["kubernetes.io/pv-protection", PV_PROVISIONER_FINALIZER,
                                    seed.attacher_finalizer]},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": seed.namespace,
                         "name": claim_name(i), "uid": claim_uid},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": seed.storage_class,
            "volumeMode": "Filesystem",
            "csi": {"driver": DRIVER, "fsType": "ext4", "volumeHandle": volume_handle(seed, i),
                    "volumeAttributes": {"clusterID": seed.cluster_id, "pool": seed.pool,
                                         "imageFeatures": "layering", "imageName": f"csi-vol-scale-{i:06d}",
                                         "journalPool": seed.pool,
                                         "storage.kubernetes.io/csiProvisionerIdentity": f"1700000000000-1234-{DRIVER}"},
                    "nodeStageSecretRef": ref, "controllerExpandSecretRef": ref},
        },
    }


def pv_status() -> dict[str, Any]:
    return {"status": {"phase": "Bound"}}


def attachment_name(i: int) -> str:
    return f"csi-scale-{i:06d}"


def attachment_body(seed: Seed, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": attachment_name(i), "finalizers": [seed.attacher_finalizer]},
        "spec": {"attacher": DRIVER, "nodeName": node_name(i), "source": {"persistentVolumeName": pv_name(i)}},
    }


def attachment_status() -> dict[str, Any]:
    return {"status": {"attached": True}}


def node_body(i: int) -> dict[str, Any]:
    name = node_name(i)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
                         "annotations": {"csi.volume.kubernetes.io/nodeid": f'{{"{DRIVER}":"{name}"}}'}}}


def csinode_body(i: int) -> dict[str, Any]:
    name = node_name(i)
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": name},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "topologyKeys": None}]}}


# ---- Go sidecars: when their informers synced -------------------------------------------------------

_KLOG = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})\s")
_POPULATED = re.compile(r"[Cc]aches populated.*?(?:type=\"?\*?v1\.|for \*v1\.)(\w+)")


def klog_time(line: str, year: int) -> datetime.datetime | None:
    """The UTC time of a klog line (`I1127 11:42:28.123456 ...`; klog writes UTC in a container
    whose TZ is unset, as here), None for any other line."""
    m = _KLOG.match(line)
    if not m:
        return None
    month, day, hour, minute, second, micro = (int(x) for x in m.groups())
    return datetime.datetime(year, month, day, hour, minute, second, micro, tzinfo=datetime.timezone.utc)


def caches_populated(log_text: str, year: int) -> dict[str, datetime.datetime]:
    """{kind: when client-go's reflector first logged 'Caches populated' for it} (klog -v=2 and up)."""
    out: dict[str, datetime.datetime] = {}
    for line in log_text.splitlines():
        m = _POPULATED.search(line)
        at = klog_time(line, year) if m else None
        if m and at is not None:
            out.setdefault(m.group(1), at)
    return out


def synced_at(populated: Mapping[str, datetime.datetime], kinds: Iterable[str]) -> datetime.datetime | None:
    """When the last of `kinds` was populated: the sidecar's informers are synced; None while one is missing."""
    times = [populated.get(kind) for kind in kinds]
    if not times or any(t is None for t in times):
        return None
    return max(t for t in times if t is not None)


def line_at(log_text: str, marker: str, year: int) -> datetime.datetime | None:
    """When the first klog line containing `marker` was written (None: not yet)."""
    for line in log_text.splitlines():
        if marker in line:
            at = klog_time(line, year)
            if at is not None:
                return at
    return None


def ready_at(log_text: str, year: int, kinds: Iterable[str], marker: str = "") -> datetime.datetime | None:
    """A Go sidecar's informers are synced once every kind in `kinds` was populated and, with a
    `marker` (a line the sidecar writes after its own WaitForCacheSync), that line was written:
    the later of the two. None while either is missing."""
    at = synced_at(caches_populated(log_text, year), kinds)
    if at is None or not marker:
        return at
    mark = line_at(log_text, marker, year)
    return None if mark is None else max(at, mark)


# ---- growth between two sizes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Growth:
    """Bytes (or seconds, ...) per 1,000 claims between an empty cluster and one with `claims`."""

    per_1000: float
    """(median at `claims` − median when empty) / claims × 1,000."""
    low: float
    """The least the rounds allow: (min at claims − max when empty) / claims × 1,000."""
    high: float
    """The most: (max at claims − min when empty) / claims × 1,000."""
    base: float
    """The median when empty (the fixed part)."""

    def to_json(self) -> dict[str, float]:
        return {"per_1000": self.per_1000, "low": self.low, "high": self.high, "base": self.base}


def growth_per_1000(empty: Sequence[float], loaded: Sequence[float], claims: int) -> Growth | None:
    """Growth per 1,000 claims from the rounds at both sizes; None without rounds at both or claims ≤ 0."""
    if not empty or not loaded or claims <= 0:
        return None
    base, top = percentile(empty, 50), percentile(loaded, 50)
    scale = 1000.0 / claims
    return Growth(per_1000=(top - base) * scale, low=(min(loaded) - max(empty)) * scale,
                  high=(max(loaded) - min(empty)) * scale, base=base)


def predict(growth: Growth, claims: int) -> float:
    """The figure the growth line gives at `claims` (fixed part + claims × growth)."""
    return growth.base + growth.per_1000 * claims / 1000.0


def value_spread(values: Sequence[float | None]) -> Spread | None:
    """Spread of the rounds that produced a value (None: no round did)."""
    present = [v for v in values if v is not None]
    return spread(present) if present else None
