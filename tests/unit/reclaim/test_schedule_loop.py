"""One pass of the leader's reclaim-space loop with fake API objects: what is recorded on the
claim for a sparsified, a busy, an encrypted and a failed volume, nothing when the term ends
mid-call, and a claim whose record cannot be written stops neither the pass nor is it sparsified
again while its record is retried."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.sparsify import Sparsified
from cephcsi.errors import Internal, Unavailable
from cephcsi.kube.events import EventRecorder
from cephcsi.kube.informer import Informer
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.calls import CsiCalls, Stopping
from cephcsi.sidecars.reclaimspace.api import ReclaimApi
from cephcsi.sidecars.reclaimspace.loop import ReclaimContext, ReclaimSpaceLoop
from cephcsi.volumes import reclaim

pytestmark = pytest.mark.unit

DRIVER = "rbd.csi.ceph.com"
NOW = datetime(2026, 11, 27, 19, 0, tzinfo=UTC)
KEY = "AQBqWlhl0Pr7KRAAu0UK6yHcLEm0BRmrwSmCJA=="


class Store:
    def __init__(self, items: dict[str, dict[str, Any]]) -> None:
        self.items = items

    def list(self) -> list[dict[str, Any]]:
        return list(self.items.values())

    def get(self, key: str) -> dict[str, Any] | None:
        return self.items.get(key)

    def has_synced(self) -> bool:
        return self.synced

    synced = True


class Recorder:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, str]]] = []
        self.events: list[tuple[str, str]] = []
        self.refuse: set[str] = set()
        """Claim names whose patch fails."""
        self.claims: Store | None = None
        """The informer cache a patch shows up in (as the watch would bring it)."""

    def annotate_claim(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        if name in self.refuse:
            raise Unavailable(f'annotate PersistentVolumeClaim "{namespace}/{name}": connection refused')
        self.patches.append((namespace, name, annotations))
        if self.claims is not None:
            self.claims.items[f"{namespace}/{name}"]["metadata"]["annotations"].update(annotations)

    def event(self, obj: Any, event_type: str, reason: str, message: str) -> None:
        self.events.append((event_type, reason))

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return {"userID": "csi", "userKey": KEY}


def claim(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "creationTimestamp": "2026-11-01T00:00:00Z",
                         "annotations": {reclaim.SCHEDULE_ANNOTATION: "@daily"}},
            "spec": {"volumeName": f"pv-{name}", "storageClassName": "sc"}, "status": {"phase": "Bound"}}


def pv(name: str) -> dict[str, Any]:
    return {"metadata": {"name": f"pv-{name}"}, "spec": {"csi": {
        "driver": DRIVER, "volumeHandle": f"vol-{name}",
        "controllerExpandSecretRef": {"name": "s", "namespace": "ceph"}}}}


def recording_sparsify() -> tuple[list[str], Callable[[str, Credentials], Sparsified]]:
    """A sparsify that reclaims nothing, and the volumes it was called for, in order."""
    called: list[str] = []

    def sparsify(volume_id: str, credentials: Credentials) -> Sparsified:
        called.append(volume_id)
        return Sparsified("img", in_use=False, used_before=0, used_after=0)

    return called, sparsify


def make_loop(sparsify: Any, names: list[str], recorder: Recorder) -> ReclaimSpaceLoop:
    recorder.claims = Store({f"ns/{n}": claim(n) for n in names})
    ctx = ReclaimContext(
        driver_name=DRIVER,
        claims=cast(Informer, recorder.claims),
        volumes=cast(Informer, Store({f"pv-{n}": pv(n) for n in names})),
        classes=cast(Informer, Store({"sc": {"metadata": {"name": "sc"}}})),
        api=cast(KubeApi, recorder), writer=cast(ReclaimApi, recorder), events=cast(EventRecorder, recorder),
        calls=CsiCalls(max_workers=1, timeout=10.0), sparsify=sparsify, now=lambda: NOW)
    return ReclaimSpaceLoop(ctx)


def run_pass(sparsify: Any, names: list[str], stop: threading.Event | None = None) -> Recorder:
    recorder = Recorder()
    ctx = ReclaimContext(
        driver_name=DRIVER,
        claims=cast(Informer, Store({f"ns/{n}": claim(n) for n in names})),
        volumes=cast(Informer, Store({f"pv-{n}": pv(n) for n in names})),
        classes=cast(Informer, Store({"sc": {"metadata": {"name": "sc"}}})),
        api=cast(KubeApi, recorder), writer=cast(ReclaimApi, recorder), events=cast(EventRecorder, recorder),
        calls=CsiCalls(max_workers=1, timeout=10.0), sparsify=sparsify, now=lambda: NOW)
    loop = ReclaimSpaceLoop(ctx)
    if stop is not None:
        loop._stop = stop
    loop.reconcile()
    return recorder


def test_each_outcome_is_recorded_on_its_claim() -> None:
    def sparsify(volume_id: str, credentials: Credentials) -> Sparsified:
        assert credentials.user_id == "csi"
        if volume_id == "vol-busy":
            return Sparsified("img", in_use=True, used_before=8, used_after=8)
        if volume_id == "vol-bad":
            raise Internal("sparsify img failed: timed out")
        if volume_id == "vol-luks":
            return Sparsified("img", in_use=False, encrypted=True)
        return Sparsified("img", in_use=False, used_before=8 << 20, used_after=0)

    recorder = run_pass(sparsify, ["bad", "busy", "good", "luks"])
    results = {name: notes[reclaim.RESULT_ANNOTATION] for _ns, name, notes in recorder.patches}
    assert results == {"bad": "error: sparsify img failed: timed out",
                       "busy": "skipped: in use (the node that stages it trims it)", "good": "reclaimed 8388608",
                       "luks": "skipped: encrypted (its ciphertext holds no zeros to return)"}
    assert {notes[reclaim.LAST_RUN_ANNOTATION] for _ns, _name, notes in recorder.patches} == {"2026-11-27T19:00:00Z"}
    assert sorted(recorder.events) == [("Normal", "ReclaimSpace"), ("Normal", "ReclaimSpace"),
                                       ("Normal", "ReclaimSpace"), ("Warning", "ReclaimSpaceFailed")]


def test_a_record_that_cannot_be_written_stops_nothing_and_is_written_later() -> None:
    sparsified: list[str] = []

    def sparsify(volume_id: str, credentials: Credentials) -> Sparsified:
        sparsified.append(volume_id)
        return Sparsified("img", in_use=False, used_before=8 << 20, used_after=0)

    recorder = Recorder()
    recorder.refuse = {"a"}
    loop = make_loop(sparsify, ["a", "b"], recorder)
    assert loop.reconcile() == ["ns/b"]  # the claim after the failed patch still ran
    assert sparsified == ["vol-a", "vol-b"] and [name for _ns, name, _notes in recorder.patches] == ["b"]
    assert recorder.events == [("Normal", "ReclaimSpace")]

    assert loop.reconcile() == []  # still refused: a is not sparsified again meanwhile
    assert sparsified == ["vol-a", "vol-b"]
    recorder.refuse = set()
    assert loop.reconcile() == ["ns/a"]
    assert sparsified == ["vol-a", "vol-b"]  # a's record written, its sparsify not repeated
    assert recorder.patches[-1] == ("ns", "a", {reclaim.LAST_RUN_ANNOTATION: "2026-11-27T19:00:00Z",
                                                reclaim.RESULT_ANNOTATION: "reclaimed 8388608"})
    assert recorder.events == [("Normal", "ReclaimSpace")] * 2
    assert loop.reconcile() == [] and sparsified == ["vol-a", "vol-b"]  # both recorded: nothing due


def test_a_term_that_ends_mid_call_records_nothing() -> None:
    stop = threading.Event()

    def sparsify(volume_id: str, credentials: Credentials) -> Sparsified:
        stop.set()
        raise Stopping("loop stopping")

    recorder = run_pass(sparsify, ["a", "b"], stop=stop)
    assert recorder.patches == [] and recorder.events == []


def test_the_loop_reads_the_claims_namespace_from_its_informer() -> None:
    sparsified, sparsify = recording_sparsify()

    recorder = Recorder()
    loop = make_loop(sparsify, ["a"], recorder)
    assert recorder.claims is not None
    del recorder.claims.items["ns/a"]["metadata"]["annotations"][reclaim.SCHEDULE_ANNOTATION]
    assert loop.reconcile() == [] and sparsified == []  # no schedule anywhere, no Namespace informer
    loop.ctx.namespaces = cast(Informer, Store({"ns": {"metadata": {"name": "ns", "annotations": {
        reclaim.SCHEDULE_ANNOTATION: "@daily"}}}}))
    assert loop.reconcile() == ["ns/a"] and sparsified == ["vol-a"]


def test_until_namespaces_are_listed_only_claims_with_their_own_schedule_run() -> None:
    sparsified, sparsify = recording_sparsify()

    recorder = Recorder()
    loop = make_loop(sparsify, ["own", "by-class"], recorder)
    assert recorder.claims is not None
    del recorder.claims.items["ns/by-class"]["metadata"]["annotations"][reclaim.SCHEDULE_ANNOTATION]
    loop.ctx.classes = cast(Informer, Store({"sc": {"metadata": {"name": "sc", "annotations": {
        reclaim.SCHEDULE_ANNOTATION: "@daily"}}}}))
    namespaces = Store({"ns": {"metadata": {"name": "ns"}}})
    namespaces.synced = False  # e.g. a ClusterRole without the namespaces grant
    loop.ctx.namespaces = cast(Informer, namespaces)
    # by-class waits: its Namespace, not known yet, may name another schedule than its class.
    assert loop.reconcile() == ["ns/own"] and sparsified == ["vol-own"]
    namespaces.synced = True
    assert loop.reconcile() == ["ns/by-class"] and sparsified == ["vol-own", "vol-by-class"]


def test_namespaces_never_listed_fall_back_to_claim_and_class_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """An install upgraded without the namespaces grant keeps its class schedules after the patience."""
    sparsified, sparsify = recording_sparsify()

    recorder = Recorder()
    loop = make_loop(sparsify, ["by-class"], recorder)
    assert recorder.claims is not None
    del recorder.claims.items["ns/by-class"]["metadata"]["annotations"][reclaim.SCHEDULE_ANNOTATION]
    loop.ctx.classes = cast(Informer, Store({"sc": {"metadata": {"name": "sc", "annotations": {
        reclaim.SCHEDULE_ANNOTATION: "@daily"}}}}))
    namespaces = Store({"ns": {"metadata": {"name": "ns"}}})
    namespaces.synced = False
    loop.ctx.namespaces = cast(Informer, namespaces)
    loop._namespaces_since = time.monotonic()  # what start() notes when it starts the informer
    assert loop.reconcile() == [] and sparsified == []  # within the patience: waits
    later = time.monotonic() + 3600
    monkeypatch.setattr("cephcsi.sidecars.reclaimspace.loop.time.monotonic", lambda: later)
    assert loop.reconcile() == ["ns/by-class"] and sparsified == ["vol-by-class"]
