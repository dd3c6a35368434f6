"""Figures of the Kubernetes sections (4a/4b): timelines from watch events, bursts, Prometheus
text, the rate limiter's floor, Lease records, failover expectations, log problems."""
from __future__ import annotations

import datetime

import pytest

from bench import kubestats
from bench.kubestats import Timeline, Timings

pytestmark = pytest.mark.unit


def _claim(name: str, phase: str = "Pending", namespace: str = "ns") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": namespace}, "status": {"phase": phase}}


def test_timeline_keeps_the_first_time_each_state_was_seen() -> None:
    t = Timeline(kubestats.object_name("ns"), {"bound": kubestats.phase_is("Bound"), "deleted": kubestats.deleted})
    assert not t.record("ADDED", _claim("a"), 1.0)
    assert t.record("MODIFIED", _claim("a", "Bound"), 2.0)
    assert not t.record("MODIFIED", _claim("a", "Bound"), 3.0)  # still Bound: the first time counts
    assert not t.record("ADDED", _claim("b", "Bound", namespace="other"), 2.5)  # not our namespace
    assert t.record("DELETED", _claim("a", "Bound"), 4.0)
    assert t.first == {"bound": {"a": 2.0}, "deleted": {"a": 4.0}}
    assert t.missing("bound", ["a", "b", "c"]) == ["b", "c"]


def test_a_deleted_event_of_a_bound_claim_does_not_count_as_bound() -> None:
    t = Timeline(kubestats.object_name(), {"bound": kubestats.phase_is("Bound")})
    t.record("DELETED", _claim("a", "Bound"), 1.0)
    assert t.first["bound"] == {}


def test_volumes_are_keyed_by_the_claim_they_are_bound_to() -> None:
    key = kubestats.claim_of_volume("ns")
    t = Timeline(key, {"created": kubestats.exists, "deleted": kubestats.deleted})
    pv = {"metadata": {"name": "pvc-1"}, "spec": {"claimRef": {"namespace": "ns", "name": "data"}}}
    other = {"metadata": {"name": "pvc-2"}, "spec": {"claimRef": {"namespace": "x", "name": "data"}}}
    unbound = {"metadata": {"name": "pv-3"}, "spec": {}}
    t.record("ADDED", pv, 1.0)
    t.record("ADDED", other, 1.5)
    t.record("ADDED", unbound, 1.6)
    t.record("DELETED", pv, 2.0)
    assert t.first == {"created": {"data": 1.0}, "deleted": {"data": 2.0}}


def test_burst_figures_from_start_and_reach_times() -> None:
    started = {f"c{i}": 10.0 + i * 0.1 for i in range(4)}  # 10.0 … 10.3
    reached = {"c0": 11.0, "c1": 12.1, "c2": 10.5, "c3": 14.3}
    b = kubestats.burst(started, reached)
    assert b.count == b.reached == 4
    assert b.all_s == pytest.approx(4.3)  # first start 10.0 → last reached 14.3
    assert b.per_second == pytest.approx(4 / 4.3)
    # latencies 1.0, 2.0, 0.3, 4.0 → nearest rank p50 = 2nd = 1.0, p99 = max
    assert b.p50_s == pytest.approx(1.0) and b.p99_s == pytest.approx(4.0) and b.max_s == pytest.approx(4.0)
    assert b.to_json()["per_second"] == pytest.approx(4 / 4.3)


def test_a_burst_with_stragglers_has_no_all_done_time() -> None:
    b = kubestats.burst({"a": 0.0, "b": 0.0}, {"a": 1.0})
    assert (b.count, b.reached, b.all_s, b.per_second, b.p50_s) == (2, 1, None, None, 1.0)
    none = kubestats.burst({"a": 0.0}, {})
    assert none.p50_s is None and none.max_s is None
    with pytest.raises(ValueError):
        kubestats.burst({}, {})


METRICS = """# HELP rest_client_requests_total Requests to the API server by method and HTTP code.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",method="GET"} 12.0
rest_client_requests_total{code="201",method="POST"} 5.0
rest_client_requests_created{code="200",method="GET"} 1.7e+09
cephcsi_sidecar_operation_seconds_count{operation="provision",outcome="success"} 100.0
cephcsi_sidecar_operation_seconds_sum{operation="provision",outcome="success"} 48.5
cephcsi_sidecar_operation_seconds_count{operation="delete",outcome="success"} 3.0
leader_election_master_status{name="rbd-csi-ceph-com"} 1.0
process_open_fds 17.0
garbage line
"""


def test_parse_metrics_and_sum_by_labels() -> None:
    samples = kubestats.parse_metrics(METRICS)
    assert ("process_open_fds", {}, 17.0) in samples
    assert kubestats.metric_sum(samples, "rest_client_requests_total") == 17.0
    assert kubestats.metric_sum(samples, "rest_client_requests_total", method="POST") == 5.0
    assert kubestats.metric_sum(samples, "cephcsi_sidecar_operation_seconds_count", operation="provision") == 100.0
    assert kubestats.metric_sum(samples, "leader_election_master_status", name="rbd-csi-ceph-com") == 1.0
    assert kubestats.metric_sum(samples, "nope") == 0.0


def test_limiter_floor() -> None:
    assert kubestats.limiter_floor_s(648, 50, 100) == pytest.approx(10.96)
    assert kubestats.limiter_floor_s(80, 50, 100) == 0.0  # fits in the burst
    assert kubestats.limiter_floor_s(1000, 0, 1) == 0.0  # unlimited


def test_parse_lease() -> None:
    lease = kubestats.parse_lease({"spec": {"holderIdentity": "vm_1", "renewTime": "2026-11-22T05:00:01.250000Z",
                                            "leaseDurationSeconds": 15, "leaseTransitions": 3}})
    assert lease.holder == "vm_1" and lease.duration_s == 15 and lease.transitions == 3
    assert lease.renew_time == datetime.datetime(2026, 11, 22, 5, 0, 1, 250000, tzinfo=datetime.timezone.utc)
    released = kubestats.parse_lease({"spec": {"holderIdentity": "", "leaseDurationSeconds": 1}})
    assert released.holder == "" and released.renew_time is None
    assert kubestats.parse_lease(None) == kubestats.Lease("", None, None, 0)


def test_failover_expectations_with_the_default_timings() -> None:
    t = Timings()
    assert t.expected("graceful") == pytest.approx((0.0, 2.4))
    assert t.expected("sigkill") == pytest.approx((13.0, 17.4))
    assert t.label() == "lease 15s / renew 10s / retry 2s"
    fast = Timings(4.0, 3.0, 0.5, jitter=0.0)
    assert fast.expected("sigkill") == pytest.approx((3.5, 4.5))
    with pytest.raises(ValueError):
        t.expected("other")


def test_median_skips_missing_values() -> None:
    assert kubestats.median([3.0, None, 1.0, 2.0]) == 2.0
    assert kubestats.median([None]) is None


def test_problem_lines_in_text_and_json_logs() -> None:
    text = "\n".join([
        "2026-11-22T05:00:00.000Z I cephcsi.cli started",
        "2026-11-22T05:00:01.000Z W cephcsi.kube.workqueue processing failed; will retry",
        "2026-11-22T05:00:02.000Z E cephcsi.csi boom",
        "Traceback (most recent call last):",
        '{"ts": "x", "level": "error", "msg": "json boom"}',
        '{"ts": "x", "level": "info", "msg": "fine"}',
    ])
    lines = kubestats.problem_lines(text)
    assert [line.split(" ", 2)[1] for line in lines[:2]] == ["W", "E"]
    assert len(lines) == 3 and "json boom" in lines[2]


def test_stages_split_each_objects_way() -> None:
    started = {"a": 0.0, "b": 1.0}
    annotated = {"a": 0.5, "b": 3.0}
    pv = {"a": 1.5, "b": 3.5}
    bound = {"a": 4.0}  # b never got there
    got = kubestats.stages(started, [("annotated", annotated), ("pv", pv), ("bound", bound)])
    assert [s.name for s in got] == ["annotated", "pv", "bound"]
    first, second, third = got
    assert (first.per_object.p50_s, first.per_object.max_s, first.last_s) == (0.5, 2.0, 3.0)
    assert (second.per_object.p50_s, second.per_object.max_s, second.last_s) == (0.5, 1.0, 3.5)
    assert second.per_object.count == 2 and second.per_object.reached == 2
    assert (third.per_object.reached, third.per_object.p50_s, third.last_s) == (1, 2.5, None)
    assert third.per_object.count == 2
    assert got[0].to_json()["name"] == "annotated"


def test_stages_skip_objects_that_missed_an_earlier_mark() -> None:
    got = kubestats.stages({"a": 0.0, "b": 0.0}, [("x", {"a": 1.0}), ("y", {"a": 2.0, "b": 5.0})])
    assert got[1].per_object.reached == 1 and got[1].per_object.max_s == 1.0 and got[1].last_s is None


def test_annotation_predicate() -> None:
    holds = kubestats.has_annotation("k1", "k2")
    assert holds("MODIFIED", {"metadata": {"annotations": {"k2": "x"}}})
    assert not holds("MODIFIED", {"metadata": {}})
    assert not holds("DELETED", {"metadata": {"annotations": {"k1": "x"}}})
