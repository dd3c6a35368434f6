"""The VolumeAttributesClass half of the resizer's decisions and the claim status it writes, as pure
functions of API objects (external-resizer v2's modify controller); the claim's status is the
only record, so a restart or a new leader continues from the API alone. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from cephcsi.errors import CephCSIError
from cephcsi.sidecars import objects
from cephcsi.sidecars.resizer.claim_status import condition, conditions_of
from cephcsi.sidecars.resizer.claim_status import is_final as is_final

PENDING = "Pending"
IN_PROGRESS = "InProgress"
INFEASIBLE = "Infeasible"
MODIFYING = "ModifyingVolume"
MODIFY_ERROR = "ModifyVolumeError"
MODIFY_CONDITIONS = frozenset({MODIFYING, MODIFY_ERROR})
IN_PROGRESS_MESSAGE = "ModifyVolume operation in progress."

# Events (external-resizer's reasons).
EVENT_MODIFY = "VolumeModify"
EVENT_SUCCESS = "VolumeModifySuccessful"
EVENT_FAILED = "VolumeModifyFailed"
EVENT_CANCELLED = "VolumeModifyCancelled"

@dataclass(frozen=True)
class Classes:
    wanted: str
    """spec.volumeAttributesClassName ("" when unset)."""
    current: str
    target: str
    """status.modifyVolumeStatus.targetVolumeAttributesClassName ("" without a status)."""
    state: str
    """status.modifyVolumeStatus.status ("" without a status)."""

    @classmethod
    def of(cls, claim: Mapping[str, Any]) -> Classes:
        status = objects.status(claim)
        modify = status.get("modifyVolumeStatus") or {}
        return cls(wanted=str(objects.spec(claim).get("volumeAttributesClassName") or ""),
                   current=str(status.get("currentVolumeAttributesClassName") or ""),
                   target=str(modify.get("targetVolumeAttributesClassName") or ""),
                   state=str(modify.get("status") or ""))

    @property
    def has_status(self) -> bool:
        return bool(self.state)


def needs_modify(claim: Mapping[str, Any]) -> bool:
    """A bound claim whose class differs from its volume's, or with a change recorded."""
    if objects.status(claim).get("phase") != "Bound" or not objects.spec(claim).get("volumeName"):
        return False
    classes = Classes.of(claim)
    return classes.has_status or classes.wanted != classes.current


@dataclass(frozen=True)
class Step:
    kind: str
    """'none', 'rolled-back' (spec cleared: drop the status), or 'modify'."""
    vac: str = ""


def decide(classes: Classes, uncertain: bool) -> Step:
    """What to do for a claim; `uncertain`: this process's last call for it to the class in the
    status failed in a way that may have half-applied it (external-resizer finishes that class
    before following a newer spec)."""
    if not classes.has_status and classes.wanted == classes.current:
        return Step("none")
    in_progress = classes.state == IN_PROGRESS
    if not classes.wanted and not in_progress:
        return Step("rolled-back")
    if in_progress and (uncertain or not classes.wanted):
        return Step("modify", classes.target)
    return Step("modify", classes.wanted)


def is_infeasible(error: BaseException) -> bool:
    return isinstance(error, CephCSIError) and error.code == grpc.StatusCode.INVALID_ARGUMENT


# ---- status updates (JSON merge patches of the status subresource) -----------------------------

def _conditions(claim: Mapping[str, Any], new: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    kept = [dict(c) for c in conditions_of(claim) if c.get("type") not in MODIFY_CONDITIONS]
    return kept + [dict(c) for c in new]


def marked(claim: Mapping[str, Any], state: str, target: str, now: str, message: str = "") -> dict[str, Any]:
    """modifyVolumeStatus = {target, state}; conditions as external-resizer sets them (Pending
    keeps the existing ones)."""
    update: dict[str, Any] = {"modifyVolumeStatus": {"targetVolumeAttributesClassName": target, "status": state}}
    if state == IN_PROGRESS:
        update["conditions"] = _conditions(claim, [condition(MODIFYING, now, IN_PROGRESS_MESSAGE)])
    elif state == INFEASIBLE:
        update["conditions"] = _conditions(
            claim, [condition(MODIFYING, now, f"ModifyVolume failed with error {message}. Waiting for retry.")])
    return update


def retry_error(claim: Mapping[str, Any], message: str, now: str) -> dict[str, Any]:
    return {"conditions": _conditions(
        claim, [condition(MODIFY_ERROR, now, f"ModifyVolume failed with error: {message}. Waiting for retry.")])}


def completed(claim: Mapping[str, Any], vac: str) -> dict[str, Any]:
    # None deletes the key in a JSON merge patch.
    return {"modifyVolumeStatus": None, "currentVolumeAttributesClassName": vac, "conditions": _conditions(claim, [])}


def rolled_back(claim: Mapping[str, Any]) -> dict[str, Any]:
    return {"modifyVolumeStatus": None, "conditions": _conditions(claim, [])}


def has_modifying_condition(claim: Mapping[str, Any]) -> bool:
    return any(c.get("type") == MODIFYING for c in conditions_of(claim))
