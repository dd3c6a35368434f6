"""/readyz of a starting controller: 503 until the informers the loops need have synced, then
200 for good; never a 200 before the sidecars' own check exists (a rollout would otherwise count
a replica ready, or route to it, while its caches are still empty)."""
from __future__ import annotations

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
