"""In-process CSI calls bounded by --timeout, joined on retry, drained on stop."""
from __future__ import annotations

import threading
import time

import pytest

from cephcsi.errors import DeadlineExceeded, InvalidArgument, OperationInFlight
from cephcsi.observability.logging import request_id_var, request_scope
from cephcsi.sidecars.calls import CsiCalls, Stopping

pytestmark = pytest.mark.unit


def test_result_and_errors_pass_through() -> None:
    calls = CsiCalls(2, timeout=5)
    assert calls.run("CreateVolume", "pvc-1", lambda: 7) == 7
    with pytest.raises(InvalidArgument):
        calls.run("CreateVolume", "pvc-1", lambda: (_ for _ in ()).throw(InvalidArgument("bad")))
    assert not calls.busy("pvc-1")


def test_timeout_leaves_the_call_running_and_a_retry_joins_it() -> None:
    calls = CsiCalls(2, timeout=0.2)
    gate, started = threading.Event(), []

    def slow() -> str:
        started.append(1)
        gate.wait(5)
        return "done"

    with pytest.raises(DeadlineExceeded, match="continues in the background"):
        calls.run("CreateVolume", "pvc-1", slow)
    assert calls.busy("pvc-1")
    with pytest.raises(OperationInFlight):
        calls.run("DeleteVolume", "pvc-1", lambda: None)  # never a delete beside a running create
    gate.set()
    assert calls.run("CreateVolume", "pvc-1", slow) == "done"
    assert len(started) == 1, "the retry must join the running call, not start a second one"
    assert calls.drain(1.0) and not calls.busy("pvc-1")


def test_stop_event_interrupts_the_wait_not_the_call() -> None:
    calls = CsiCalls(2, timeout=10)
    gate, stop = threading.Event(), threading.Event()
    threading.Timer(0.1, stop.set).start()
    began = time.monotonic()
    with pytest.raises(Stopping):
        calls.run("CreateVolume", "pvc-1", lambda: gate.wait(60), stop)
    assert time.monotonic() - began < 30, "the stop ends the wait, not the 60 s call"
    assert not calls.drain(0.1)
    gate.set()
    assert calls.drain(2)


def test_the_request_id_follows_the_call() -> None:
    calls = CsiCalls(1, timeout=5)
    with request_scope("abc123"):
        assert calls.run("CreateVolume", "pvc-1", request_id_var.get) == "abc123"


def test_nothing_starts_once_stopped() -> None:
    calls, stop, ran = CsiCalls(1, timeout=5), threading.Event(), []
    stop.set()
    with pytest.raises(Stopping, match="not started"):
        calls.run("CreateVolume", "pvc-1", lambda: ran.append(1), stop)
    assert not ran
