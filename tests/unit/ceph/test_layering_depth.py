"""Clone-chain depth follows the parent of the snapshot a child reads through."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import rbd

from cephcsi.ceph import layering

pytestmark = pytest.mark.unit


class FakeImage:
    """An image whose head and snapshots each have their own parent (pool 'rbd')."""

    def __init__(self, image_id: str, head_parent: tuple[str, str] | None,
                 snaps: dict[str, tuple[int, tuple[str, str] | None]] | None = None) -> None:
        self.image_id = image_id
        self.head_parent = head_parent
        self.snaps = snaps or {}
        self.snap_id: int | None = None

    def __enter__(self) -> FakeImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.snap_id = None

    def list_snaps(self) -> list[dict[str, Any]]:
        return [{"id": sid, "name": name, "size": 1, "namespace": 2} for name, (sid, _) in self.snaps.items()]

    def set_snap_by_id(self, snap_id: int | None) -> None:
        self.snap_id = snap_id

    def _parent(self) -> tuple[str, str] | None:
        if self.snap_id is None:
            return self.head_parent
        return next(parent for sid, parent in self.snaps.values() if sid == self.snap_id)

    def get_parent_image_spec(self) -> dict[str, str]:
        parent = self._parent()
        if parent is None:
            raise rbd.ImageNotFound("no parent")
        return {"pool_name": "rbd", "pool_namespace": "", "image_name": parent[0], "snap_name": parent[1]}

    def parent_id(self) -> str:
        parent = self._parent()
        assert parent is not None
        return parent[0]


class FakeSession:
    @contextmanager
    def ioctx(self, pool: str, namespace: str = "") -> Iterator[object]:
        yield object()


def test_a_child_of_a_snapshot_taken_before_its_image_was_flattened_counts_the_old_chain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # base ← s1 (snapshot image) ← v (restored volume, flattened since without deep-flatten:
    # its head is flat, its snapshot 'tmp' still reads through s1) ← s2 (cut from v@tmp).
    images = {
        "base": FakeImage("base", None, {"p1": (1, None)}),
        "s1": FakeImage("s1", ("base", "p1"), {"p2": (2, ("base", "p1"))}),
        "v": FakeImage("v", None, {"tmp": (3, ("s1", "p2"))}),
    }
    monkeypatch.setattr(layering, "open_by_id", lambda io, image_id: images[image_id])
    s2 = FakeImage("s2", ("v", "tmp"))
    assert layering.depth(FakeSession(), s2) == 3  # type: ignore[arg-type]
    assert layering.depth(FakeSession(), images["v"]) == 0  # type: ignore[arg-type]


def test_a_parent_snapshot_not_listed_falls_back_to_the_parents_head(monkeypatch: pytest.MonkeyPatch) -> None:
    images = {"a": FakeImage("a", None), "b": FakeImage("b", ("a", "gone"))}
    monkeypatch.setattr(layering, "open_by_id", lambda io, image_id: images[image_id])
    assert layering.depth(FakeSession(), FakeImage("c", ("b", "x"))) == 2  # type: ignore[arg-type]
