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
