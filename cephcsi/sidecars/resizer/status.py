"""The resizer's decisions and the PVC status it writes, as pure functions of API objects; the claim's
status (allocatedResources, allocatedResourceStatuses, conditions) is the only record, so a restart
or a new leader continues from it. `plan` is external-resizer's expandAndRecover. Design:
docs/design/sidecars.md.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from cephcsi.errors import CephCSIError
from cephcsi.sidecars import objects
from cephcsi.sidecars.resizer.claim_status import condition as condition
from cephcsi.sidecars.resizer.claim_status import conditions_of
from cephcsi.sidecars.resizer.claim_status import is_final as is_final
from cephcsi.sidecars.provisioner.request import format_bytes, quantity_bytes

STORAGE = "storage"
RESIZING = "Resizing"
FS_RESIZE_PENDING = "FileSystemResizePending"
CONTROLLER_RESIZE_ERROR = "ControllerResizeError"
NODE_RESIZE_ERROR = "NodeResizeError"
RESIZE_CONDITIONS = frozenset({RESIZING, FS_RESIZE_PENDING, CONTROLLER_RESIZE_ERROR, NODE_RESIZE_ERROR})

CONTROLLER_IN_PROGRESS = "ControllerResizeInProgress"
CONTROLLER_INFEASIBLE = "ControllerResizeInfeasible"
NODE_PENDING = "NodeResizePending"
NODE_IN_PROGRESS = "NodeResizeInProgress"
NODE_INFEASIBLE = "NodeResizeInfeasible"

FS_PENDING_MESSAGE = "Waiting for user to (re-)start a pod to finish file system resize of volume on node."

# Of the final codes (claim_status.is_final), these mean the requested size itself cannot be had.
_INFEASIBLE = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.NOT_FOUND})


@dataclass(frozen=True)
class Sizes:
    """The sizes of one claim and its PV that the decisions need (bytes; None: not set)."""

    requested: int
    capacity: int
    pv: int
    allocated: int | None
    resize_status: str
    fs_pending: bool

    @classmethod
    def of(cls, claim: Mapping[str, Any], pv: Mapping[str, Any]) -> Sizes:
        status = objects.status(claim)
        allocated = (status.get("allocatedResources") or {}).get(STORAGE)
        return cls(
            requested=requested_bytes(claim),
            capacity=_bytes((status.get("capacity") or {}).get(STORAGE), "status.capacity.storage"),
            pv=_bytes((objects.spec(pv).get("capacity") or {}).get(STORAGE), "PV spec.capacity.storage"),
            allocated=None if allocated is None else _bytes(allocated, "status.allocatedResources.storage"),
            resize_status=str((status.get("allocatedResourceStatuses") or {}).get(STORAGE) or ""),
            fs_pending=any(c.get("type") == FS_RESIZE_PENDING and c.get("status") == "True"
                           for c in status.get("conditions") or []),
        )


@dataclass(frozen=True)
class Plan:
    size: int
    """Bytes to expand the volume to."""
    mark: bool
    """Record ControllerResizeInProgress + allocatedResources before calling the driver."""


def requested_bytes(claim: Mapping[str, Any]) -> int:
    requests = (objects.spec(claim).get("resources") or {}).get("requests") or {}
    return _bytes(requests.get(STORAGE), "spec.resources.requests.storage")


def _bytes(value: object, what: str) -> int:
    return quantity_bytes(value, what) if value not in (None, "") else 0


def needs_resize(claim: Mapping[str, Any]) -> bool:
    """external-resizer's pvcNeedResize: a bound claim asking for more than it has."""
    if objects.status(claim).get("phase") != "Bound" or not objects.spec(claim).get("volumeName"):
        return False
    try:
        sizes_requested = requested_bytes(claim)
        capacity = _bytes((objects.status(claim).get("capacity") or {}).get(STORAGE), "status.capacity.storage")
    except CephCSIError:
        return False
    return sizes_requested > capacity


def plan(sizes: Sizes, final_error: bool) -> Plan | None:
    """What to expand to, or None when there is nothing for the controller to do."""
    size = _size_when_pv_small(sizes, final_error) if sizes.pv < sizes.requested else _size_when_pv_grown(sizes)
    if size is None:
        return None
    return Plan(size=size, mark=sizes.allocated != size or sizes.resize_status != CONTROLLER_IN_PROGRESS)


def _size_when_pv_small(sizes: Sizes, final_error: bool) -> int | None:
    status, allocated = sizes.resize_status, sizes.allocated
    if status in (NODE_PENDING, NODE_IN_PROGRESS, NODE_INFEASIBLE):
        size = allocated if allocated is not None else sizes.requested
        # A node step of an earlier expansion is pending: let it finish first.
        return None if status != NODE_INFEASIBLE and sizes.pv >= size else size
    if status == CONTROLLER_IN_PROGRESS and not final_error and allocated is not None:
        return allocated  # an uncertain earlier attempt: finish it before anything else
    return sizes.requested  # new, infeasible before, or failed finally: the user's current request


def _size_when_pv_grown(sizes: Sizes) -> int | None:
    """The PV already has the requested size: a spurious event, or an expansion whose API
    updates did not all happen (crash, leader change) and must be completed."""
    status, allocated = sizes.resize_status, sizes.allocated
    if status in (NODE_PENDING, NODE_IN_PROGRESS):
        return None
    if status in (NODE_INFEASIBLE, CONTROLLER_IN_PROGRESS, CONTROLLER_INFEASIBLE):
        return allocated if allocated is not None else sizes.requested
    if allocated is not None and status == "":
        return allocated
    return None if sizes.fs_pending else sizes.requested


def is_infeasible(error: BaseException) -> bool:
    return isinstance(error, CephCSIError) and error.code in _INFEASIBLE


# ---- status updates (dicts for a JSON merge patch of the status subresource) -------------------

def merge_conditions(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """external-resizer's MergeResizeConditionsOfPVC: conditions of other kinds are kept; of the
    resize kinds only the ones in `new` remain (an unchanged one keeps its transition time)."""
    wanted = {c["type"]: dict(c) for c in new}
    merged: list[dict[str, Any]] = []
    for item in old:
        kind = item.get("type")
        if kind not in RESIZE_CONDITIONS:
            merged.append(dict(item))
        elif kind in wanted:
            replacement = wanted.pop(str(kind))
            same = item.get("status") == replacement["status"] and item.get("message", "") == replacement.get("message", "")
            merged.append(dict(item) if same else replacement)
    return merged + list(wanted.values())


def _conditions(claim: Mapping[str, Any], new: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return merge_conditions(conditions_of(claim), new)


def in_progress(claim: Mapping[str, Any], size: int, now: str) -> dict[str, Any]:
    return {"conditions": _conditions(claim, [condition(RESIZING, now)]),
            "allocatedResources": {STORAGE: format_bytes(size)},
            "allocatedResourceStatuses": {STORAGE: CONTROLLER_IN_PROGRESS}}


def node_pending(claim: Mapping[str, Any], now: str) -> dict[str, Any]:
    return {"conditions": _conditions(claim, [condition(FS_RESIZE_PENDING, now, FS_PENDING_MESSAGE)]),
            "allocatedResourceStatuses": {STORAGE: NODE_PENDING}}


def finished(claim: Mapping[str, Any], size: int) -> dict[str, Any]:
    # None deletes the key in a JSON merge patch.
    return {"capacity": {STORAGE: format_bytes(size)}, "conditions": _conditions(claim, []),
            "allocatedResourceStatuses": {STORAGE: None}}


def failed(claim: Mapping[str, Any], message: str, now: str, infeasible: bool) -> dict[str, Any]:
    """A final error: ControllerResizeError, and for an infeasible size the status that lets the
    user lower the request (recovery from expansion failure)."""
    update: dict[str, Any] = {"conditions": _conditions(claim, [condition(CONTROLLER_RESIZE_ERROR, now, message)])}
    if infeasible:
        update["allocatedResourceStatuses"] = {STORAGE: CONTROLLER_INFEASIBLE}
    return update
