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


def decide_in(obj: dict[str, Any], namespace_annotations: dict[str, str] | None,
              class_annotations: dict[str, str] | None = None) -> due.Due | due.Refused | None:
    """decide() with the claim's Namespace ("ns") carrying `namespace_annotations` (None: the
    Namespace is not in the cache)."""
    storage_class = {"metadata": {"name": "sc", "annotations": class_annotations or {}}}
    namespace = None if namespace_annotations is None else {"metadata": {"name": "ns",
                                                                         "annotations": namespace_annotations}}
    return due.decide(obj, DRIVER, lambda name: PV if name == "pv-1" else None,
                      lambda name: storage_class if name == "sc" else None, NOW,
                      namespace_of=lambda name: namespace if name == "ns" else None)


@pytest.mark.parametrize("claim_schedule, namespace_schedule, class_schedule, expected", [
    ("@hourly", "@daily", "@weekly", "@hourly"),  # the claim's own wins
    ("", "@daily", "@weekly", "@daily"),  # then its Namespace's, over the class's
    ("", "", "@weekly", "@weekly"),
    ("", " @weekly ", "", "@weekly"),  # the Namespace alone is enough
    ("  ", "@weekly", "", "@weekly"),  # a blank value is no schedule: the next level applies
    ("", "", "", None),
])
def test_claim_then_namespace_then_class(claim_schedule: str, namespace_schedule: str, class_schedule: str,
                                         expected: str | None) -> None:
    def only(value: str) -> dict[str, str]:
        return {reclaim.SCHEDULE_ANNOTATION: value} if value else {}

    found = decide_in(claim(only(claim_schedule)), only(namespace_schedule), only(class_schedule))
    if expected is None:
        assert found is None
    else:
        assert isinstance(found, due.Due) and found.schedule == expected


def test_a_namespace_not_in_the_cache_or_of_another_claim_gives_no_schedule() -> None:
    assert decide_in(claim(), None) is None
    other = claim()
    other["metadata"]["namespace"] = "elsewhere"
    assert decide_in(other, {reclaim.SCHEDULE_ANNOTATION: "@daily"}) is None
    # ... and the class's still applies there.
    assert isinstance(decide_in(other, {}, {reclaim.SCHEDULE_ANNOTATION: "@daily"}), due.Due)


def test_an_unreadable_namespace_schedule_is_refused_unless_the_claim_has_its_own() -> None:
    bad = {reclaim.SCHEDULE_ANNOTATION: "sometimes"}
    refused = decide_in(claim(), bad)
    assert isinstance(refused, due.Refused) and refused.schedule == "sometimes"
    assert isinstance(decide_in(claim({reclaim.SCHEDULE_ANNOTATION: "@daily"}), bad), due.Due)


def test_the_namespace_schedule_waits_for_its_next_time_after_the_recorded_run() -> None:
    ran_today = claim({reclaim.LAST_RUN_ANNOTATION: "2026-11-27T00:00:05Z"})
    assert decide_in(ran_today, {reclaim.SCHEDULE_ANNOTATION: "@daily"}) is None
    assert isinstance(decide_in(ran_today, {reclaim.SCHEDULE_ANNOTATION: "@hourly"}), due.Due)


def test_while_namespaces_are_unknown_only_the_claims_own_schedule_counts() -> None:
    storage_class = {"metadata": {"name": "sc", "annotations": {reclaim.SCHEDULE_ANNOTATION: "@daily"}}}

    def decide_unknown(obj: dict[str, Any]) -> due.Due | due.Refused | None:
        return due.decide(obj, DRIVER, lambda name: PV if name == "pv-1" else None,
                          lambda name: storage_class if name == "sc" else None, NOW, namespace_of=None)

    assert decide_unknown(claim()) is None
    found = decide_unknown(claim({reclaim.SCHEDULE_ANNOTATION: "@hourly"}))
    # The class still comes with the decision (its secrets are the sparsify's credentials).
    assert isinstance(found, due.Due) and found.schedule == "@hourly" and found.storage_class == storage_class
