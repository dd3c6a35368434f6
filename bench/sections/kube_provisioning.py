"""Slot 4a: PVC → Bound through the embedded provisioner, on the real control plane
(tests/controlplane) and the real Ceph cluster. Pending until the embedded sidecars exist
(cephcsi/sidecars/runner.py); replace this module's SECTION with a real one then."""
from __future__ import annotations

from bench.sections.base import pending

SECTION = pending(
    "kube-provisioning",
    "4a. Kubernetes: PVC → Bound (embedded provisioner)",
    "needs the embedded sidecars",
    [
        "1 PVC: create → Bound latency (p50 over repeats), beside a direct CreateVolume",
        "burst of 100 PVCs: time until all Bound, p50/p99 per PVC",
        "controller RSS (VmRSS/VmHWM) and CPU seconds during the burst",
    ],
)
