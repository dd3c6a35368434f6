"""Prometheus metrics of the CSI surface and the Ceph calls behind it.

Names follow the kubernetes-csi sidecars where one exists, so dashboards built for them work.
Metric objects are module-level because prometheus_client registries are process-wide.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

class _Histogram(Histogram):
    """A Histogram whose `labels()` finds an existing child without the metric's lock.

    Every CSI call looks up one child and every Ceph call another (a dozen per CreateVolume);
    prometheus_client's `labels()` stringifies the values and takes a lock shared by all threads
    each time (py-spy under the bench's batches: bench/README.md). Children are never removed
    here, and a dict read is atomic, so an existing child is returned straight from the dict;
    a new label set (or values that are not strings) takes the library's own path."""

    def labels(self, *labelvalues: Any, **labelkwargs: Any) -> Any:
        if labelvalues and not labelkwargs:
            child = getattr(self, "_metrics", {}).get(labelvalues)
            if child is not None:
                return child
        return super().labels(*labelvalues, **labelkwargs)


CSI_OPERATIONS = _Histogram(
    "csi_sidecar_operations_seconds",
    "Duration of CSI operations served by the driver, by method and resulting gRPC code.",
    ["driver_name", "method_name", "grpc_status_code"],
    buckets=_LATENCY_BUCKETS,
)

CEPH_CALLS = _Histogram(
    "cephcsi_ceph_call_seconds",
    "Duration of calls into librados/librbd, by operation and outcome.",
    ["operation", "outcome"],
    buckets=_LATENCY_BUCKETS,
)

SLOW_CALLS = Counter(
    "cephcsi_slow_operations_total",
    "CSI operations that took longer than the slow-call threshold.",
    ["method_name"],
)

NODE_MAPPER = Gauge(
    "cephcsi_node_mapper_info",
    "The node plugin's default mapper: 1 for the one volumes without a StorageClass 'mounter' get "
    "(selection 'auto' when --mounter=auto picked it, 'configured' when --mounter named it). "
    "rbd-nbd and fuse mappings end when the node plugin restarts.",
    ["mapper", "selection"],
)
