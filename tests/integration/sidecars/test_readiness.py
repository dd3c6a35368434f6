"""/readyz of a starting controller: 503 until the informers the loops need have synced, then
200 for good; never a 200 before the sidecars' own check exists (a rollout would otherwise count
a replica ready, or route to it, while its caches are still empty)."""
from __future__ import annotations

import os
import time

import pytest

from tests.integration.sidecars.conftest import StartControllers

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.ceph]


def test_readyz_is_not_200_before_the_informers_synced(start_controllers: StartControllers) -> None:
    controller = start_controllers(wait=False)[0]
    answers: list[tuple[int, str]] = []
    deadline = time.monotonic() + 120
    ready_since = 0.0
    while time.monotonic() < deadline:
        status, body = controller.http("/readyz")
        if status:  # 0: not listening yet
            answers.append((status, body))
        if status == 200:
            ready_since = ready_since or time.monotonic()
            if time.monotonic() - ready_since > 2.0:
                break
        else:
            assert not ready_since, f"/readyz went back to {status} after 200: {answers[-3:]}"
        time.sleep(0.01)
    assert ready_since, f"never ready within 120 s: {answers[-3:]}\n{controller.log()[-3000:]}"
    assert answers[0][0] == 503, answers[:3]  # the HTTP server came up before the caches synced
    for status, body in answers:
        if status == 200:
            assert '"informers": "ok"' in body, body


def test_an_idle_leader_runs_few_threads(start_controllers: StartControllers) -> None:
    """Worker pools grow with work and shrink when idle: a leader with nothing to do holds a few
    tens of threads (it held ~250 with --worker-threads' 100 per loop started up front)."""
    controller = start_controllers()[0]
    deadline = time.monotonic() + 120
    while not controller.is_leader() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert controller.is_leader(), controller.log()[-3000:]
    assert controller.process is not None
    time.sleep(3)
    threads = len(os.listdir(f"/proc/{controller.process.pid}/task"))
    print(f"idle leader threads: {threads}")
    assert threads <= 40, f"{threads} threads in an idle leader"
