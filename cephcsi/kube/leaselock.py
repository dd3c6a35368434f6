"""Read and write a coordination.k8s.io/v1 Lease for leader election: PUTs carry the resourceVersion
read (409 Conflict on a stale one) and keep the fields they do not manage. The elector depends on
the `LeaseLock` protocol only. Design: docs/design/kubernetes-machinery.md.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from kubernetes import client as k8s

from cephcsi.kube import apierrors
from cephcsi.kube.clock import micro_time, parse_time


class LeaseConflict(Exception):
    """Someone else created or changed the lease since we read it."""


@dataclass(frozen=True)
class LeaseRecord:
    """The leader-election view of a Lease."""

    holder_identity: str
    """Current holder; "" when released."""
    lease_duration_seconds: int
    """How long others must wait after they last saw a change before taking over."""
    acquire_time: datetime | None
    """When the current holder acquired it."""
    renew_time: datetime | None
    """When the holder last renewed it (informational; expiry never compares wall clocks)."""
    lease_transitions: int
    """How many times the holder changed."""
    resource_version: str = ""
    """metadata.resourceVersion as read; required for update."""
    raw: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The Lease object as read (updates keep its other fields)."""

    def with_changes(self, **changes: Any) -> LeaseRecord:
        """A copy with some fields changed."""
        return replace(self, **changes)


def lease_seconds(duration: float) -> int:
    """A lease duration as the whole seconds the Lease stores (rounded up, at least 1)."""
    return max(1, math.ceil(duration))


class LeaseLock(Protocol):
    """Storage of one lease."""

    def get(self, timeout: float) -> LeaseRecord | None:
        """The lease, or None if it does not exist."""
        ...

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        """Create the lease; LeaseConflict if it exists."""
        ...

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        """Replace the lease if record.resource_version is current; LeaseConflict otherwise."""
        ...

    def describe(self) -> str:
        """"namespace/name" for logs."""
        ...


class KubeLeaseLock:
    """LeaseLock on the API server. Give it an ApiClient of its own (not the one the
    controllers use), so a saturated client-side rate limiter can never delay a renewal."""

    def __init__(self, api_client: k8s.ApiClient, namespace: str, name: str) -> None:
        self.namespace = namespace
        self.name = name
        self._api = k8s.CoordinationV1Api(api_client)

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    def get(self, timeout: float) -> LeaseRecord | None:
        try:
            response = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=_timeout(timeout))
        except k8s.ApiException as exc:
            if apierrors.is_not_found(exc):
                return None
            raise
        return record_from_lease(json.loads(response.data))

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        body = self._body(record)
        body["metadata"].pop("resourceVersion", None)
        try:
            response = self._api.create_namespaced_lease(
                self.namespace, body, _preload_content=False, _request_timeout=_timeout(timeout))
        except k8s.ApiException as exc:
            if apierrors.is_conflict(exc):
                raise LeaseConflict(f"lease {self.describe()} was created by someone else") from exc
            raise
        return record_from_lease(json.loads(response.data))

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        if not record.resource_version:
            raise ValueError("update needs the resourceVersion that was read")
        try:
            response = self._api.replace_namespaced_lease(
                self.name, self.namespace, self._body(record), _preload_content=False,
                _request_timeout=_timeout(timeout))
        except k8s.ApiException as exc:
            if apierrors.is_conflict(exc) or apierrors.is_not_found(exc):
                raise LeaseConflict(f"lease {self.describe()} changed since it was read") from exc
            raise
        return record_from_lease(json.loads(response.data))

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        body: dict[str, Any] = copy.deepcopy(record.raw) if record.raw else {}
        body["apiVersion"] = "coordination.k8s.io/v1"
        body["kind"] = "Lease"
        meta = body.setdefault("metadata", {})
        meta["name"] = self.name
        meta["namespace"] = self.namespace
        if record.resource_version:
            meta["resourceVersion"] = record.resource_version
        spec = body.setdefault("spec", {})
        spec["holderIdentity"] = record.holder_identity
        spec["leaseDurationSeconds"] = record.lease_duration_seconds
        spec["leaseTransitions"] = record.lease_transitions
        spec["acquireTime"] = micro_time(record.acquire_time) if record.acquire_time else None
        spec["renewTime"] = micro_time(record.renew_time) if record.renew_time else None
        return body


def record_from_lease(lease: dict[str, Any]) -> LeaseRecord:
    """Parse a Lease (as a dict) into a LeaseRecord."""
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder_identity=str(spec.get("holderIdentity") or ""),
        lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=parse_time(spec.get("acquireTime")),
        renew_time=parse_time(spec.get("renewTime")),
        lease_transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        raw=lease,
    )


def _timeout(seconds: float) -> tuple[float, float]:
    # Connect and read each get half, so one call never takes longer than `seconds` in total.
    half = max(0.05, seconds / 2)
    return (half, half)
