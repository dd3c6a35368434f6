"""Which claims the leader's reclaim-space loop runs (cephcsi.sidecars.reclaimspace.due)."""
from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cephcsi.sidecars.reclaimspace import due
from cephcsi.volumes import reclaim

pytestmark = pytest.mark.unit

DRIVER = "rbd.csi.ceph.com"
NOW = datetime(2026, 11, 27, 19, 0, tzinfo=UTC)


def claim(annotations: dict[str, str] | None = None, phase: str = "Bound", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-11-20T10:00:00Z",
                         "annotations": annotations or {}, **meta},
            "spec": {"volumeName": "pv-1", "storageClassName": "sc"}, "status": {"phase": phase}}


PV = {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}}


def decide(obj: dict[str, Any], pv: dict[str, Any] | None = None,
           class_annotations: dict[str, str] | None = None) -> due.Due | due.Refused | None:
    storage_class = {"metadata": {"name": "sc", "annotations": class_annotations or {}}}
    return due.decide(obj, DRIVER, lambda name: (pv if pv is not None else PV) if name == "pv-1" else None,
                      lambda name: storage_class if name == "sc" else None, NOW)


def test_a_claim_due_by_its_own_or_its_classes_schedule() -> None:
    found = decide(claim({reclaim.SCHEDULE_ANNOTATION: "@daily"}))
    assert isinstance(found, due.Due) and (found.volume_id, found.claim_key) == ("vol-1", "ns/c")
    assert isinstance(decide(claim(), class_annotations={reclaim.SCHEDULE_ANNOTATION: "@weekly"}), due.Due)


def test_not_due_before_the_next_time_after_the_recorded_run() -> None:
    ran_today = claim({reclaim.SCHEDULE_ANNOTATION: "@daily", reclaim.LAST_RUN_ANNOTATION: "2026-11-27T00:00:05Z"})
    assert decide(ran_today) is None


@pytest.mark.parametrize("obj, pv", [
    (claim(), None),  # no schedule anywhere
    (claim({reclaim.SCHEDULE_ANNOTATION: "@daily"}, phase="Pending"), None),
    (claim({reclaim.SCHEDULE_ANNOTATION: "@daily"}, deletionTimestamp="2026-11-27T18:00:00Z"), None),
    (claim({reclaim.SCHEDULE_ANNOTATION: "@daily"}),
     {"metadata": {"name": "pv-1"}, "spec": {"csi": {"driver": "other.csi", "volumeHandle": "x"}}}),
    (claim({reclaim.SCHEDULE_ANNOTATION: "@daily"}), {"metadata": {"name": "pv-1"}, "spec": {"nfs": {}}}),
])
def test_claims_that_are_not_ours_or_not_ready_are_left_alone(obj: dict[str, Any], pv: dict[str, Any] | None) -> None:
    assert decide(obj, pv) is None


def test_an_unreadable_schedule_is_refused_with_the_reason() -> None:
    found = decide(claim({reclaim.SCHEDULE_ANNOTATION: "every day"}))
    assert isinstance(found, due.Refused) and "five fields" in found.reason
