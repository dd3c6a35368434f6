"""The shared handler thread (cephcsi.kube.handlers.DispatchLoop): one thread for several
informers, per-informer order, stop waits for a handler in progress, resyncs of every member."""
from __future__ import annotations

import threading
import time
from typing import Callable

import pytest

from cephcsi.kube.handlers import DispatchLoop, Dispatcher, EventHandler, HandlerRegistration, Note
from cephcsi.kube.store import KubeObject, Store

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]


def _obj(name: str) -> KubeObject:
    return {"metadata": {"name": name, "resourceVersion": "1"}}


def _threads(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == name)


def _wait(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_several_dispatchers_share_one_thread_and_keep_their_order() -> None:
    loop = DispatchLoop("test-shared-handlers")
    seen: dict[str, list[str]] = {"a": [], "b": []}
    dispatchers = []

    def recorder(label: str) -> EventHandler:
        return EventHandler(on_add=lambda o: seen[label].append(o["metadata"]["name"]))

    for label in ("a", "b"):
        d = Dispatcher(label, Store(), loop)
        reg = HandlerRegistration(recorder(label), 0)
        d.registrations = (reg,)
        dispatchers.append((d, reg))
    for d, reg in dispatchers:
        d.start()
    for i in range(50):
        for d, reg in dispatchers:
            d.post(Note("add", (reg,), new=_obj(f"{d.name}{i}")))
    assert _threads("test-shared-handlers") == 1
    assert _wait(lambda: len(seen["a"]) == 50 and len(seen["b"]) == 50)
    assert seen["a"] == [f"a{i}" for i in range(50)] and seen["b"] == [f"b{i}" for i in range(50)]
    for d, _ in dispatchers:
        d.stop()
        assert d.done.wait(5)
    assert _wait(lambda: _threads("test-shared-handlers") == 0)
    # A member started later gets a new thread.
    again = Dispatcher("c", Store(), loop)
    again.start()
    assert _threads("test-shared-handlers") == 1
    again.stop()
    assert again.done.wait(5)


def test_stop_waits_for_the_handler_in_progress_and_drops_later_notes() -> None:
    loop = DispatchLoop("test-stop-handlers")
    entered, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow(obj: KubeObject) -> None:
        calls.append(obj["metadata"]["name"])
        entered.set()
        release.wait(5)

    d = Dispatcher("slow", Store(), loop)
    reg = HandlerRegistration(EventHandler(on_add=slow), 0)
    d.registrations = (reg,)
    d.start()
    d.post(Note("add", (reg,), new=_obj("first")))
    assert entered.wait(5)
    d.post(Note("add", (reg,), new=_obj("queued")))
    d.stop()
    assert not d.done.wait(0.2)  # the first handler is still running
    release.set()
    assert d.done.wait(5)
    assert calls == ["first"]


def test_a_dispatcher_never_started_is_done_when_stopped() -> None:
    d = Dispatcher("idle", Store(), DispatchLoop("test-never-handlers"))
    d.stop()
    assert d.done.is_set()
    assert _threads("test-never-handlers") == 0


def test_resyncs_of_a_quiet_member_run_while_another_is_busy() -> None:
    loop = DispatchLoop("test-resync-handlers")
    store = Store()
    store.upsert(_obj("cached"))
    resynced = threading.Event()
    quiet = Dispatcher("quiet", store, loop)
    reg = HandlerRegistration(EventHandler(on_update=lambda old, new: resynced.set()), 0.05)
    quiet.registrations = (reg,)
    busy = Dispatcher("busy", Store(), loop)
    busy_reg = HandlerRegistration(EventHandler(on_add=lambda o: time.sleep(0.001)), 0)
    busy.registrations = (busy_reg,)
    quiet.start()
    busy.start()
    quiet.post(Note("synced", (reg,)))
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            busy.post(Note("add", (busy_reg,), new=_obj("x")))
            time.sleep(0.0005)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        assert resynced.wait(5)
    finally:
        stop.set()
        feeder.join()
        quiet.stop()
        busy.stop()
        assert quiet.done.wait(10) and busy.done.wait(10)


def test_a_note_that_fails_outside_the_handlers_does_not_end_the_shared_thread() -> None:
    loop = DispatchLoop("test-failing-note")
    seen: list[str] = []

    class Broken(Dispatcher):
        def deliver(self, note: Note) -> None:
            raise RuntimeError("not a handler's failure")

    broken = Broken("broken", Store(), loop)
    healthy = Dispatcher("healthy", Store(), loop)
    reg = HandlerRegistration(EventHandler(on_add=lambda o: seen.append(o["metadata"]["name"])), 0)
    healthy.registrations = (reg,)
    broken.start()
    healthy.start()
    broken.post(Note("add", (), new=_obj("x")))
    healthy.post(Note("add", (reg,), new=_obj("after")))
    assert _wait(lambda: seen == ["after"]), "the other informer's notes are still delivered"
    for d in (broken, healthy):
        d.stop()
        assert d.done.wait(5)
