"""The resizer's VolumeAttributesClass decisions and status patches (pure logic)."""
from __future__ import annotations

from typing import Any

import pytest

from cephcsi.errors import FailedPrecondition, InvalidArgument, OperationInFlight
from cephcsi.sidecars.resizer import modify_status as ms

pytestmark = pytest.mark.unit


def claim(wanted: str | None = "gold", current: str | None = None, state: str = "", target: str = "",
          phase: str = "Bound", conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if current is not None:
        status["currentVolumeAttributesClassName"] = current
    if state:
        status["modifyVolumeStatus"] = {"status": state, "targetVolumeAttributesClassName": target}
    spec: dict[str, Any] = {"volumeName": "pv-1"}
    if wanted is not None:
        spec["volumeAttributesClassName"] = wanted
    return {"metadata": {"name": "c", "namespace": "ns"}, "spec": spec, "status": status}


def test_needs_modify_only_bound_claims_with_a_difference_or_a_recorded_change() -> None:
    assert ms.needs_modify(claim("gold", None))
    assert not ms.needs_modify(claim("gold", "gold"))
    assert not ms.needs_modify(claim(None, None))
    assert not ms.needs_modify(claim("gold", None, phase="Pending"))
    assert ms.needs_modify(claim("gold", "gold", state=ms.INFEASIBLE, target="bad"))


@pytest.mark.parametrize("kwargs, uncertain, expected", [
    ({"wanted": "gold", "current": "gold"}, False, ms.Step("none")),
    ({"wanted": "gold", "current": "silver"}, False, ms.Step("modify", "gold")),
    # The spec moved on while a call to the old target may have half-applied it: finish that first.
    ({"wanted": "new", "current": "a", "state": ms.IN_PROGRESS, "target": "old"}, True, ms.Step("modify", "old")),
    # Not uncertain (a new leader, or a final error): follow the spec.
    ({"wanted": "new", "current": "a", "state": ms.IN_PROGRESS, "target": "old"}, False, ms.Step("modify", "new")),
    # Back to the current class after an infeasible one: re-applied, which clears the status.
    ({"wanted": "gold", "current": "gold", "state": ms.INFEASIBLE, "target": "bad"}, False, ms.Step("modify", "gold")),
    ({"wanted": None, "current": None, "state": ms.INFEASIBLE, "target": "bad"}, False, ms.Step("rolled-back")),
    ({"wanted": None, "current": "a", "state": ms.IN_PROGRESS, "target": "b"}, False, ms.Step("modify", "b")),
])
def test_decide(kwargs: dict[str, Any], uncertain: bool, expected: ms.Step) -> None:
    assert ms.decide(ms.Classes.of(claim(**kwargs)), uncertain) == expected


def test_only_invalid_argument_is_infeasible_and_try_again_codes_are_not_final() -> None:
    assert ms.is_infeasible(InvalidArgument("x")) and ms.is_final(InvalidArgument("x"))
    assert ms.is_final(FailedPrecondition("x")) and not ms.is_infeasible(FailedPrecondition("x"))
    assert not ms.is_final(OperationInFlight("busy"))
    assert not ms.is_final(RuntimeError("not ours"))


def test_status_patches_keep_other_conditions() -> None:
    other = {"type": "Resizing", "status": "True"}
    current = claim("gold", "silver", conditions=[other, {"type": ms.MODIFY_ERROR, "status": "True"}])
    marked = ms.marked(current, ms.IN_PROGRESS, "gold", "now")
    assert marked["modifyVolumeStatus"] == {"targetVolumeAttributesClassName": "gold", "status": ms.IN_PROGRESS}
    assert [c["type"] for c in marked["conditions"]] == ["Resizing", ms.MODIFYING]
    assert "conditions" not in ms.marked(current, ms.PENDING, "gold", "now")
    infeasible = ms.marked(current, ms.INFEASIBLE, "gold", "now", "bogus key")
    assert "bogus key" in infeasible["conditions"][-1]["message"]
    done = ms.completed(current, "gold")
    assert done == {"modifyVolumeStatus": None, "currentVolumeAttributesClassName": "gold", "conditions": [other]}
    assert ms.rolled_back(current) == {"modifyVolumeStatus": None, "conditions": [other]}
