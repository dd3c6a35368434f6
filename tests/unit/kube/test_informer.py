"""Informer logic against a scripted fake API (list pages + watch streams)."""
from __future__ import annotations

import json
import queue
import threading
import time
from typing import Any

import pytest

from cephcsi.kube.backoff import BackoffSettings
from cephcsi.kube.informer import EventHandler, Informer, InformerSettings, enqueue_handler
from cephcsi.kube.workqueue import WorkQueue

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]

FAST = InformerSettings(backoff=BackoffSettings(initial=0.01, maximum=0.05), min_watch_duration=0.0)


class FakeResponse:
    def __init__(self, data: bytes = b"") -> None:
        self.data = data
        self.lines: queue.Queue[bytes | BaseException | None] = queue.Queue()
        self.closed = threading.Event()

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()

    def shutdown(self) -> None:
        self.closed.set()
        self.lines.put(None)

    def stream(self, amt: Any = None, decode_content: bool = True) -> Any:
        while True:
            item = self.lines.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class FakeServer:
    """Holds ConfigMap-like objects; serves paged lists and scripted watches."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.calls: list[dict[str, Any]] = []
        self.watches: queue.Queue[FakeResponse] = queue.Queue()
        self.current: FakeResponse | None = None
        self.list_pages = 0

    def put(self, name: str, value: str) -> dict[str, Any]:
        self.rv += 1
        obj = {"kind": "ConfigMap", "apiVersion": "v1",
               "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(self.rv)},
               "data": {"v": value}}
        self.objects[name] = obj
        return obj

    def remove(self, name: str) -> dict[str, Any]:
        self.rv += 1
        obj = self.objects.pop(name)
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}

    def __call__(self, **kwargs: Any) -> FakeResponse:
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            response = FakeResponse()
            self.current = response
            self.watches.put(response)
            return response
        self.list_pages += 1
        names = sorted(self.objects)
        start = int(kwargs.get("_continue") or 0)
        limit = kwargs["limit"]
        page = names[start:start + limit]
        items = []
        for n in page:  # list items carry no kind/apiVersion, like the real API
            item = {k: v for k, v in self.objects[n].items() if k not in ("kind", "apiVersion")}
            items.append(item)
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if start + limit < len(names):
            meta["continue"] = str(start + limit)
        return FakeResponse(json.dumps({"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta,
                                        "items": items}).encode())

    def next_watch(self, timeout: float = 2.0) -> FakeResponse:
        return self.watches.get(timeout=timeout)

    def emit(self, etype: str, obj: dict[str, Any]) -> None:
        assert self.current is not None
        line = json.dumps({"type": etype, "object": obj}).encode() + b"\n"
        # Split the line across two chunks: the decoder must reassemble it.
        self.current.lines.put(line[:7])
        self.current.lines.put(line[7:])


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.changed = threading.Condition()

    def handler(self, **kw: Any) -> EventHandler:
        return EventHandler(
            on_add=lambda o: self._rec("add", o["metadata"]["name"], o["data"]["v"]),
            on_update=lambda old, new: self._rec("update", new["metadata"]["name"], old["data"]["v"], new["data"]["v"]),
            on_delete=lambda o, unknown: self._rec("delete", o["metadata"]["name"], unknown),
            **kw)

    def _rec(self, *event: Any) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

    def wait_for(self, count: int, timeout: float = 2.0) -> list[tuple[Any, ...]]:
        with self.changed:
            self.changed.wait_for(lambda: len(self.events) >= count, timeout)
            return list(self.events)


@pytest.fixture
def server() -> FakeServer:
    srv = FakeServer()
    srv.put("a", "1")
    srv.put("b", "1")
    return srv


def started(server: FakeServer, rec: Recorder, settings: InformerSettings = FAST, **kw: Any) -> Informer:
    informer = Informer(server, name="fake", settings=settings)
    informer.add_handler(rec.handler(**kw))
    informer.start()
    assert informer.wait_for_sync(2)
    return informer


def test_initial_list_is_delivered_before_synced_and_items_get_kind(server: FakeServer) -> None:
    rec = Recorder()
    informer = started(server, rec)
    try:
        assert rec.events == [("add", "a", "1"), ("add", "b", "1")]
        cached = informer.get_by_name("ns", "a")
        assert cached is not None and cached["kind"] == "ConfigMap" and cached["apiVersion"] == "v1"
        assert informer.last_sync_resource_version == str(server.rv)
    finally:
        informer.stop()


def test_the_cache_keeps_no_managed_fields(server: FakeServer) -> None:
    """managedFields is dropped from listed and watched objects alike; everything else is kept."""
    fields = [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:data": {"f:v": {}}}}]
    server.objects["a"]["metadata"]["managedFields"] = fields
    rec = Recorder()
    informer = started(server, rec)
    try:
        server.next_watch()
        watched = server.put("c", "1")
        watched["metadata"]["managedFields"] = fields
        server.emit("ADDED", watched)
        rec.wait_for(3)
        for name in ("a", "c"):
            cached = informer.get_by_name("ns", name)
            assert cached is not None and "managedFields" not in cached["metadata"], cached
            assert cached["metadata"]["name"] == name and cached["data"] == {"v": "1"}
    finally:
        informer.stop()


def test_watch_events_update_cache_and_reach_handlers_in_order(server: FakeServer) -> None:
    rec = Recorder()
    informer = started(server, rec)
    try:
        watch = server.next_watch()
        assert watch is server.current
        assert server.calls[-1]["resource_version"] == str(server.rv)
        assert server.calls[-1]["allow_watch_bookmarks"] is True
        server.emit("ADDED", server.put("c", "1"))
        server.emit("MODIFIED", server.put("c", "2"))
        server.emit("BOOKMARK", {"kind": "ConfigMap", "metadata": {"resourceVersion": "500"}})
        server.emit("DELETED", server.remove("a"))
        events = rec.wait_for(5)
        assert events[2:] == [("add", "c", "1"), ("update", "c", "1", "2"), ("delete", "a", False)]
        assert sorted(informer.store.keys()) == ["ns/b", "ns/c"]
        assert informer.last_sync_resource_version == str(server.rv)
    finally:
        informer.stop()


def test_expired_watch_relists_and_reports_the_difference(server: FakeServer) -> None:
    rec = Recorder()
    informer = started(server, rec)
    try:
        server.next_watch()
        # Changes the informer never hears about as events:
        server.remove("a")
        server.put("b", "2")
        server.put("d", "1")
        server.emit("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})
        events = rec.wait_for(5)
        assert sorted(events[2:], key=str) == sorted(
            [("add", "d", "1"), ("update", "b", "1", "2"), ("delete", "a", True)], key=str)
        assert sorted(informer.store.keys()) == ["ns/b", "ns/d"]
        server.next_watch()
        assert server.calls[-1]["resource_version"] == str(server.rv)
    finally:
        informer.stop()


def test_broken_watch_resumes_from_the_last_seen_version(server: FakeServer) -> None:
    rec = Recorder()
    informer = started(server, rec)
    try:
        watch = server.next_watch()
        server.emit("ADDED", server.put("c", "1"))
        rec.wait_for(3)
        lists_before = server.list_pages
        watch.lines.put(ConnectionResetError("peer reset"))
        server.next_watch()
        assert server.calls[-1]["resource_version"] == str(server.rv)
        assert server.list_pages == lists_before  # resumed, not relisted
    finally:
        informer.stop()


def test_lists_are_paged(server: FakeServer) -> None:
    for i in range(7):
        server.put(f"p{i}", "1")
    rec = Recorder()
    informer = started(server, rec, settings=InformerSettings(page_size=3, backoff=FAST.backoff))
    try:
        assert len(informer.list()) == 9
        assert server.list_pages == 3
    finally:
        informer.stop()


def test_late_handler_gets_existing_objects_and_its_own_sync(server: FakeServer) -> None:
    rec = Recorder()
    informer = started(server, rec)
    try:
        late = Recorder()
        reg = informer.add_handler(late.handler())
        assert reg.wait_for_sync(2)
        assert late.wait_for(2) == [("add", "a", "1"), ("add", "b", "1")]
    finally:
        informer.stop()


def test_resync_redelivers_updates_per_handler(server: FakeServer) -> None:
    rec, quiet = Recorder(), Recorder()
    informer = Informer(server, name="fake", settings=FAST)
    informer.add_handler(rec.handler(resync_period=0.1))
    informer.add_handler(quiet.handler())
    informer.start()
    try:
        events = rec.wait_for(6, timeout=3)
        assert ("update", "a", "1", "1") in events and ("update", "b", "1", "1") in events
        # A second resync round for `rec` (one dispatch thread, in order): had `quiet` been due
        # for one, it would have had it by now.
        rec.wait_for(8, timeout=3)
        assert quiet.events == [("add", "a", "1"), ("add", "b", "1")]
    finally:
        informer.stop()


def test_slow_handler_does_not_hold_back_the_cache(server: FakeServer) -> None:
    release = threading.Event()
    informer = Informer(server, name="fake", settings=FAST)
    def slow(_obj: dict[str, Any]) -> None:
        release.wait(5)

    informer.add_handler(EventHandler(on_add=slow))
    informer.start()
    try:
        server.next_watch()
        server.emit("ADDED", server.put("c", "1"))
        deadline = time.monotonic() + 2
        while informer.get("ns/c") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert informer.get("ns/c") is not None
        assert not informer.has_synced()  # the initial adds are not all delivered yet
    finally:
        release.set()
        informer.stop()


def test_failing_handler_does_not_stop_the_others(server: FakeServer) -> None:
    rec = Recorder()
    informer = Informer(server, name="fake", settings=FAST)
    def broken(_obj: dict[str, Any]) -> None:
        raise ZeroDivisionError

    informer.add_handler(EventHandler(on_add=broken))
    informer.add_handler(rec.handler())
    informer.start()
    try:
        assert informer.wait_for_sync(2)
        assert len(rec.events) == 2
    finally:
        informer.stop()


def test_stop_interrupts_a_blocked_watch_quickly(server: FakeServer) -> None:
    informer = started(server, Recorder())
    watch = server.next_watch()
    start = time.monotonic()
    # Uninterrupted, the watch thread would read until the 150 s inactivity timeout and stop()
    # would give up after its own 30 s: finishing well before proves the interrupt, on any load.
    informer.stop(timeout=30)
    assert time.monotonic() - start < 20
    assert watch.closed.is_set()


def test_selectors_are_passed_to_list_and_watch(server: FakeServer) -> None:
    informer = Informer(server, name="fake", settings=FAST, label_selector="app=x", field_selector="metadata.name=a")
    informer.start()
    try:
        server.next_watch()
        assert all(c["label_selector"] == "app=x" and c["field_selector"] == "metadata.name=a" for c in server.calls)
    finally:
        informer.stop()


def test_enqueue_handler_feeds_a_work_queue(server: FakeServer) -> None:
    wq: WorkQueue[str] = WorkQueue("informer-enqueue")
    informer = Informer(server, name="fake", settings=FAST)
    informer.add_handler(enqueue_handler(wq.add, accept=lambda o: o["metadata"]["name"] != "b"))
    informer.start()
    try:
        assert informer.wait_for_sync(2)
        assert wq.get(0) == "ns/a"
        assert wq.get(0) is None
    finally:
        informer.stop()
        wq.shut_down()


def test_stop_during_watch_request_does_not_leave_a_blocked_stream(server: FakeServer) -> None:
    real_call = server.__call__
    entered, release = threading.Event(), threading.Event()

    def slow_watch(**kwargs: Any) -> FakeResponse:
        if kwargs.get("watch"):
            entered.set()
            release.wait(2)  # the request is "in flight" when stop() runs
        return real_call(**kwargs)

    informer = Informer(slow_watch, name="fake", settings=FAST)
    informer.start()
    assert entered.wait(2)
    stopper = threading.Thread(target=informer.stop, kwargs={"timeout": 30})
    stopper.start()
    deadline = time.monotonic() + 10
    while not informer.stopped:  # stop() has begun: the request is still "in flight"
        assert time.monotonic() < deadline
        time.sleep(0.001)
    release.set()
    start = time.monotonic()
    stopper.join(30)
    # Read to its end, the late response would hold stop() for its 30 s (150 s inactivity timeout).
    assert not stopper.is_alive() and time.monotonic() - start < 20
    assert server.next_watch().closed.is_set()


def test_repeated_watch_failures_end_in_a_relist(server: FakeServer) -> None:
    informer = started(server, Recorder())
    try:
        lists_before = server.list_pages
        for _ in range(5):
            server.next_watch().lines.put(ConnectionResetError("reset"))
        server.next_watch()
        assert server.list_pages == lists_before + 1
    finally:
        informer.stop()
