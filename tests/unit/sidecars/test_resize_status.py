"""The resizer's decision table and status updates (pure)."""
from __future__ import annotations

from typing import Any

import pytest

from cephcsi.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, OutOfRange
from cephcsi.sidecars.resizer import status as st

pytestmark = pytest.mark.unit
Gi = 1 << 30


def claim(request: str = "2Gi", capacity: str = "1Gi", *, allocated: str | None = None, resize_status: str = "",
          conditions: list[dict[str, Any]] | None = None, phase: str = "Bound") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "capacity": {"storage": capacity}, "conditions": conditions or []}
    if allocated is not None:
        status["allocatedResources"] = {"storage": allocated}
    if resize_status:
        status["allocatedResourceStatuses"] = {"storage": resize_status}
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
            "spec": {"volumeName": "pvc-u1", "resources": {"requests": {"storage": request}}}, "status": status}


def pv(capacity: str = "1Gi") -> dict[str, Any]:
    return {"metadata": {"name": "pvc-u1"}, "spec": {"capacity": {"storage": capacity}}}


def plan(c: dict[str, Any], p: dict[str, Any], final: bool = False) -> st.Plan | None:
    return st.plan(st.Sizes.of(c, p), final)


def test_needs_resize_only_bound_claims_asking_for_more() -> None:
    assert st.needs_resize(claim())
    assert not st.needs_resize(claim("1Gi"))
    assert not st.needs_resize(claim(phase="Pending"))
    assert not st.needs_resize(claim(request="garbage"))


def test_a_new_request_is_expanded_to_the_requested_size_and_marked() -> None:
    assert plan(claim(), pv()) == st.Plan(2 * Gi, mark=True)


def test_an_uncertain_attempt_is_finished_at_its_recorded_size() -> None:
    # The user raised the request again while 2Gi was in progress: 2Gi first.
    c = claim("3Gi", allocated="2Gi", resize_status=st.CONTROLLER_IN_PROGRESS)
    assert plan(c, pv()) == st.Plan(2 * Gi, mark=False)
    # ... unless the last attempt failed finally in this process: then the current request.
    assert plan(c, pv(), final=True) == st.Plan(3 * Gi, mark=True)


def test_a_lowered_request_after_an_infeasible_size_is_used() -> None:
    c = claim("1536Mi", allocated="100Gi", resize_status=st.CONTROLLER_INFEASIBLE)
    assert plan(c, pv()) == st.Plan(1536 << 20, mark=True)


def test_pending_node_step_is_left_to_the_kubelet() -> None:
    assert plan(claim(allocated="2Gi", resize_status=st.NODE_PENDING), pv("2Gi")) is None
    assert plan(claim("3Gi", allocated="2Gi", resize_status=st.NODE_PENDING), pv("2Gi")) is None
    assert plan(claim(conditions=[{"type": st.FS_RESIZE_PENDING, "status": "True"}]), pv("2Gi")) is None


def test_pv_grown_but_status_not_written_is_completed() -> None:
    # Leader killed after the PV update: the next leader redoes the (idempotent) call and the status.
    c = claim(allocated="2Gi", resize_status=st.CONTROLLER_IN_PROGRESS)
    assert plan(c, pv("2Gi")) == st.Plan(2 * Gi, mark=False)


def test_error_classes() -> None:
    assert not st.is_final(DeadlineExceeded("x")) and not st.is_final(RuntimeError("api"))
    assert st.is_final(FailedPrecondition("x")) and not st.is_infeasible(FailedPrecondition("x"))
    assert st.is_infeasible(OutOfRange("x")) and st.is_infeasible(InvalidArgument("x"))


def test_conditions_merge_keeps_foreign_ones_and_transition_times() -> None:
    old = [{"type": "Other", "status": "True"}, {"type": st.RESIZING, "status": "True", "lastTransitionTime": "t0"},
           {"type": st.CONTROLLER_RESIZE_ERROR, "status": "True", "message": "m"}]
    merged = st.merge_conditions(old, [st.condition(st.RESIZING, "t1")])
    assert merged == [old[0], old[1]]
    assert st.merge_conditions(old, []) == [old[0]]


def test_status_updates() -> None:
    c = claim(conditions=[{"type": st.RESIZING, "status": "True", "lastTransitionTime": "t0"}])
    assert st.in_progress(claim(), 2 * Gi, "t1") == {
        "conditions": [{"type": st.RESIZING, "status": "True", "lastTransitionTime": "t1"}],
        "allocatedResources": {"storage": "2Gi"}, "allocatedResourceStatuses": {"storage": st.CONTROLLER_IN_PROGRESS}}
    pending = st.node_pending(c, "t2")
    assert [x["type"] for x in pending["conditions"]] == [st.FS_RESIZE_PENDING]
    assert pending["allocatedResourceStatuses"] == {"storage": st.NODE_PENDING}
    assert st.finished(c, 2 * Gi) == {"capacity": {"storage": "2Gi"}, "conditions": [],
                                      "allocatedResourceStatuses": {"storage": None}}
    failed = st.failed(c, "boom", "t3", infeasible=True)
    assert failed["allocatedResourceStatuses"] == {"storage": st.CONTROLLER_INFEASIBLE}
    assert [(x["type"], x.get("message")) for x in failed["conditions"]] == [(st.CONTROLLER_RESIZE_ERROR, "boom")]
    assert "allocatedResourceStatuses" not in st.failed(c, "boom", "t3", infeasible=False)
