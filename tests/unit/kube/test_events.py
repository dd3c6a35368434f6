"""Event aggregation decisions and the recorder's never-block, never-raise contract."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiException

from cephcsi.kube.clock import FakeClock
from cephcsi.kube.events import NORMAL, WARNING, EventCorrelator, EventRecorder, EventSettings, ObjectReference

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

PVC = ObjectReference("PersistentVolumeClaim", "data", "ns", "uid-1", "v1")
AT = datetime(2026, 11, 27, 22, 26, 19, tzinfo=timezone.utc)


def test_identical_events_within_the_window_are_aggregated() -> None:
    clock = FakeClock()
    corr = EventCorrelator(window=600, clock=clock)
    first = corr.decide(PVC, WARNING, "ProvisioningFailed", "no space", AT)
    assert first.action == "create" and first.count == 1
    assert first.name.startswith("data.")
    clock.advance(30)
    second = corr.decide(PVC, WARNING, "ProvisioningFailed", "no space", AT)
    third = corr.decide(PVC, WARNING, "ProvisioningFailed", "no space", AT)
    assert (second.action, second.name, second.count) == ("patch", first.name, 2)
    assert (third.action, third.count) == ("patch", 3)
    assert third.first_timestamp == first.first_timestamp


def test_the_first_timestamp_is_when_the_event_happened_not_when_it_was_decided() -> None:
    clock = FakeClock()
    corr = EventCorrelator(clock=clock)
    clock.advance(5)  # the writer thread reaches the event later than it was recorded
    first = corr.decide(PVC, WARNING, "ProvisioningFailed", "no space", AT)
    repeat = corr.decide(PVC, WARNING, "ProvisioningFailed", "no space", AT + timedelta(milliseconds=1))
    assert first.first_timestamp == AT and repeat.first_timestamp == AT


def test_different_message_reason_type_or_object_creates_a_new_event() -> None:
    corr = EventCorrelator(clock=FakeClock())
    base = corr.decide(PVC, WARNING, "ProvisioningFailed", "a", AT)
    others = [
        corr.decide(PVC, WARNING, "ProvisioningFailed", "b", AT),
        corr.decide(PVC, WARNING, "Provisioning", "a", AT),
        corr.decide(PVC, NORMAL, "ProvisioningFailed", "a", AT),
        corr.decide(ObjectReference("PersistentVolumeClaim", "data", "ns", "uid-2", "v1"),
                    WARNING, "ProvisioningFailed", "a", AT),
    ]
    assert all(d.action == "create" for d in others)
    assert len({d.name for d in others} | {base.name}) == 5


def test_repeat_after_the_window_creates_a_new_event() -> None:
    clock = FakeClock()
    corr = EventCorrelator(window=60, clock=clock)
    first = corr.decide(PVC, NORMAL, "Provisioning", "x", AT)
    clock.advance(61)
    again = corr.decide(PVC, NORMAL, "Provisioning", "x", AT)
    assert again.action == "create" and again.name != first.name and again.count == 1


def test_forget_makes_the_next_repeat_create() -> None:
    corr = EventCorrelator(clock=FakeClock())
    first = corr.decide(PVC, NORMAL, "Provisioning", "x", AT)
    corr.forget(first.key)
    assert corr.decide(PVC, NORMAL, "Provisioning", "x", AT).action == "create"


def test_spam_filter_limits_events_per_object() -> None:
    clock = FakeClock()
    corr = EventCorrelator(spam_burst=25, spam_interval=300, clock=clock)
    decisions = [corr.decide(PVC, WARNING, "Failed", f"attempt {i}", AT).action for i in range(30)]
    assert decisions.count("drop") == 5
    # Another object has its own budget.
    other = ObjectReference("PersistentVolumeClaim", "other", "ns", "uid-9", "v1")
    assert corr.decide(other, WARNING, "Failed", "x", AT).action == "create"
    clock.advance(300)
    assert corr.decide(PVC, WARNING, "Failed", "later", AT).action == "create"
    assert corr.decide(PVC, WARNING, "Failed", "later2", AT).action == "drop"


def test_cache_is_bounded() -> None:
    corr = EventCorrelator(cache_size=3, spam_burst=1000, clock=FakeClock())
    first = corr.decide(PVC, NORMAL, "R", "m0", AT)
    for i in range(1, 5):
        corr.decide(PVC, NORMAL, "R", f"m{i}", AT)
    # m0 was evicted: its repeat is a new Event.
    assert corr.decide(PVC, NORMAL, "R", "m0", AT).name != first.name


def test_object_reference_from_dict_and_typed_model() -> None:
    d = {"kind": "PersistentVolume", "apiVersion": "v1",
         "metadata": {"name": "pv1", "uid": "u", "resourceVersion": "5"}}
    ref = ObjectReference.of(d)
    assert ref == ObjectReference("PersistentVolume", "pv1", "", "u", "v1", "5")
    assert ref.event_namespace == "default"
    typed = SimpleNamespace(kind="PersistentVolumeClaim", api_version="v1",
                            metadata=SimpleNamespace(name="c", namespace="ns", uid="u2", resource_version="9"))
    assert ObjectReference.of(typed).to_api() == {
        "kind": "PersistentVolumeClaim", "name": "c", "namespace": "ns", "uid": "u2", "apiVersion": "v1",
        "resourceVersion": "9"}
    with pytest.raises(ValueError):
        ObjectReference.of({"metadata": {"name": "no-kind"}})


class FakeCoreApi:
    """Records calls; can block, fail or forget events."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, str, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.patch_status: int | None = None
        self.create_status: int | None = None

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.gate.wait(5)
        if self.create_status:
            raise ApiException(status=self.create_status)
        self.created.append(body)

    def patch_namespaced_event(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.gate.wait(5)
        if self.patch_status:
            raise ApiException(status=self.patch_status)
        self.patched.append((name, namespace, body))


def recorder(api: FakeCoreApi, **kw: Any) -> EventRecorder:
    settings = EventSettings(component="test-component", host="node-1", retry_delay=0.01, **kw)
    return EventRecorder(None, settings, core_api=api)


def test_recorder_creates_then_patches() -> None:
    api = FakeCoreApi()
    rec = recorder(api)
    for _ in range(3):
        rec.event(PVC, WARNING, "ProvisioningFailed", "no space")
    assert rec.flush(2)
    rec.stop()
    assert len(api.created) == 1
    body = api.created[0]
    assert body["involvedObject"]["name"] == "data" and body["metadata"]["namespace"] == "ns"
    assert body["source"] == {"component": "test-component", "host": "node-1"}
    assert body["count"] == 1 and body["type"] == WARNING
    assert [p[2]["count"] for p in api.patched] == [2, 3]
    assert all(p[0] == body["metadata"]["name"] for p in api.patched)


def test_recorder_recreates_an_expired_event_with_the_running_count() -> None:
    api = FakeCoreApi()
    rec = recorder(api)
    rec.event(PVC, NORMAL, "Provisioning", "x")
    rec.flush(2)
    api.patch_status = 404
    rec.event(PVC, NORMAL, "Provisioning", "x")
    rec.flush(2)
    rec.stop()
    assert [c["count"] for c in api.created] == [1, 2]


def test_recorder_never_blocks_and_drops_when_full() -> None:
    api = FakeCoreApi()
    api.gate.clear()  # the API hangs
    rec = recorder(api, queue_size=2, spam_burst=100)
    import time

    start = time.monotonic()
    for i in range(10):
        rec.event(PVC, NORMAL, "R", f"m{i}")
    # The API hangs until the gate opens: a blocking event() would never get here.
    assert time.monotonic() - start < 30
    api.gate.set()
    assert rec.flush(3)
    rec.stop()
    # One in flight plus two queued got through; the rest were dropped.
    assert 2 <= len(api.created) <= 3


def test_recorder_never_raises_into_the_caller() -> None:
    api = FakeCoreApi()
    api.create_status = 403
    rec = recorder(api)
    rec.event({"metadata": {"name": "no-kind"}}, NORMAL, "R", "m")  # invalid target
    rec.event(PVC, "Bogus", "R", "m")  # invalid type
    rec.event(PVC, NORMAL, "R", "m")  # API refuses
    assert rec.flush(2)
    rec.stop()
    rec.event(PVC, NORMAL, "R", "after stop")
    assert api.created == []
