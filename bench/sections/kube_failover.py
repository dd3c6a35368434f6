"""Slot 4b: leader failover of the embedded sidecars between two controller replicas.
Pending until the embedded sidecars (with leader election on a Lease) exist."""
from __future__ import annotations

from bench.sections.base import pending

SECTION = pending(
    "kube-failover",
    "4b. Kubernetes: leader failover (embedded sidecars)",
    "needs the embedded sidecars",
    [
        "graceful: SIGTERM the leader → the standby holds the Lease and provisions a PVC (seconds)",
        "SIGKILL the leader → the standby takes over after the lease expires (seconds)",
    ],
)
