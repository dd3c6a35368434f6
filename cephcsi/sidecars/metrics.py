"""Prometheus metrics of the embedded provisioner and attacher, under external-provisioner's names
where one exists. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

from prometheus_client import Counter, Histogram

_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

OPERATIONS = Histogram(
    "cephcsi_sidecar_operation_seconds",
    "Duration of one provisioner/attacher work item, by operation and outcome "
    "(success, final_error, in_progress, rescheduled, skipped).",
    ["operation", "outcome"],
    buckets=_BUCKETS,
)

PROVISION_TOTAL = Counter(
    "controller_persistentvolumeclaim_provision", "Volumes provisioned, by StorageClass.", ["class"]
)
PROVISION_FAILED = Counter(
    "controller_persistentvolumeclaim_provision_failed", "Failed provisioning attempts, by StorageClass.", ["class"]
)
PROVISION_DURATION = Histogram(
    "controller_persistentvolumeclaim_provision_duration_seconds",
    "Duration of successful provisioning attempts, by StorageClass.", ["class"], buckets=_BUCKETS,
)
DELETE_TOTAL = Counter(
    "controller_persistentvolume_delete", "Volumes deleted, by StorageClass.", ["class"]
)
DELETE_FAILED = Counter(
    "controller_persistentvolume_delete_failed", "Failed volume deletions, by StorageClass.", ["class"]
)
DELETE_DURATION = Histogram(
    "controller_persistentvolume_delete_duration_seconds",
    "Duration of successful volume deletions, by StorageClass.", ["class"], buckets=_BUCKETS,
)
CLEANUPS = Counter(
    "cephcsi_provisioner_orphan_cleanups",
    "Volumes deleted because their claim went away before its PV was created.", ["outcome"],
)
