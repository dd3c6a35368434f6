"""The inline trash purge (the mgr refused the task) never holds a DeleteVolume longer than its
budget: the call answers UNAVAILABLE, the removal goes on, and the retry joins it."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cephcsi.ceph.trash import InlinePurges
from cephcsi.errors import Internal, Unavailable

pytestmark = pytest.mark.unit


class SlowTrash:
    """rbd.RBD() whose trash_remove blocks until released (a large image being purged)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.release = threading.Event()
        self.removed: list[str] = []
        self.fail = fail

    def __call__(self) -> SlowTrash:
        return self

    def trash_remove(self, io: Any, image_id: str, force: bool = False) -> None:
        assert force
        self.release.wait(30)
        self.removed.append(image_id)
        if self.fail is not None:
            raise self.fail


class FakeSession:
    @contextmanager
    def ioctx(self, pool: str, namespace: str = "") -> Iterator[object]:
        yield object()


def test_a_slow_purge_answers_unavailable_and_the_retry_joins_it(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = SlowTrash()
    monkeypatch.setattr("cephcsi.ceph.trash.rbd.RBD", slow)
    purges = InlinePurges(budget_seconds=0.05)
    session: Any = FakeSession()
    with pytest.raises(Unavailable, match="continues in the background, retry later"):
        purges.run(session, "rbd", "", "id1", "rbd/id1")
    with pytest.raises(Unavailable):
        purges.run(session, "rbd", "", "id1", "rbd/id1")  # still running: joined, not restarted
    slow.release.set()
    purges.budget_seconds = 30
    purges.run(session, "rbd", "", "id1", "rbd/id1")
    assert slow.removed == ["id1"], "one removal for all the calls"


def test_a_failed_inline_purge_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = SlowTrash(fail=RuntimeError("boom"))
    slow.release.set()
    monkeypatch.setattr("cephcsi.ceph.trash.rbd.RBD", slow)
    with pytest.raises(Internal, match="purging trashed image rbd/id2 failed"):
        InlinePurges(budget_seconds=30).run(FakeSession(), "rbd", "", "id2", "rbd/id2")  # type: ignore[arg-type]


class CountingGets(dict[str, Any]):
    """The purges-in-flight table, telling when both callers have looked their purge up."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.wanted = wanted
        self.looked_up = threading.Event()
        self.gets = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.gets += 1
        if self.gets >= self.wanted:
            self.looked_up.set()
        return super().get(key, default)


def test_every_call_waiting_on_a_failed_purge_gets_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = SlowTrash(fail=RuntimeError("boom"))
    monkeypatch.setattr("cephcsi.ceph.trash.rbd.RBD", slow)
    purges = InlinePurges(budget_seconds=30)
    table = CountingGets(wanted=2)
    purges._running = table
    outcomes: list[BaseException | None] = []

    def call() -> None:
        try:
            purges.run(FakeSession(), "rbd", "", "id3", "rbd/id3")  # type: ignore[arg-type]
            outcomes.append(None)
        except BaseException as error:  # noqa: BLE001 - what the test inspects
            outcomes.append(error)

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    assert table.looked_up.wait(30)  # both callers hold the one purge: now let it fail
    slow.release.set()
    for caller in callers:
        caller.join(30)
    assert len(outcomes) == 2 and all(isinstance(o, Internal) for o in outcomes), outcomes
    assert slow.removed == ["id3"]
