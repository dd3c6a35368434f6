"""The snapshot budget (--minsnapshotsonimage / --maxsnapshotsonimage) as pure logic: which
children `limit_snapshots` asks the mgr to flatten, against fakes of an RBD image and a session."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
import rbd

from cephcsi.ceph import layering
from cephcsi.ceph.connection import Session
from cephcsi.volumes.flatten import FlattenPolicy, Placement, limit_snapshots

pytestmark = pytest.mark.unit

TRASH, USER = layering.TRASH_NAMESPACE, 0
WHERE = Placement("rbd", "", "csi-vol-source")


def child(name: str, *, pool: str = "rbd", namespace: str = "", trash: bool = False) -> dict[str, object]:
    return {"pool": pool, "pool_namespace": namespace, "image": name, "id": f"id-{name}", "trash": trash}


class FakeImage:
    """An image's snapshots as (id, namespace) and the children of each; remembers the snapshot
    it is set to, as librbd's list_children2 lists the children of the one set."""

    def __init__(self, snaps: list[tuple[int, int]], children: dict[int, list[dict[str, object]]] | None = None,
                 fail_listing: bool = False) -> None:
        self.snaps = snaps
        self.children = children or {}
        self.fail_listing = fail_listing
        self.current: int | None = None
        self.listed: list[int] = []
        self.closed = False

    def list_snaps(self) -> list[dict[str, object]]:
        return [{"id": i, "name": f"snap-{i}", "size": 1 << 20, "namespace": ns} for i, ns in self.snaps]

    def set_snap_by_id(self, snap_id: int | None) -> None:
        self.current = snap_id

    def list_children2(self) -> list[dict[str, object]]:
        assert self.current is not None, "children are listed per snapshot"
        if self.fail_listing:
            raise rbd.Timeout("list children")
        self.listed.append(self.current)
        return self.children.get(self.current, [])

    def __enter__(self) -> FakeImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True


class FakeSession:
    """Records mgr commands; `refuse` makes the mgr answer ENOENT; `trashed` are images that can
    only be opened by id (the RBD trash), keyed by id."""

    def __init__(self, refuse: bool = False, trashed: dict[str, FakeImage] | None = None) -> None:
        self.refuse = refuse
        self.trashed = trashed or {}
        self.flattens: list[str] = []

    def mgr_command(self, command: str) -> tuple[int, str]:
        parsed = json.loads(command)
        assert parsed["prefix"] == "rbd task add flatten"
        self.flattens.append(parsed["image_spec"])
        return (-2, "image does not exist") if self.refuse else (0, "")

    @contextmanager
    def ioctx(self, pool: str, namespace: str | None = None) -> Iterator[str]:
        yield f"{pool}/{namespace}"


def run(image: FakeImage, session: FakeSession, policy: FlattenPolicy) -> None:
    limit_snapshots(cast(Session, session), cast(rbd.Image, image), WHERE, policy)


@pytest.fixture
def opened_by_id(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeImage]:
    """Images `layering.open_by_id` finds (what is in the RBD trash), by id."""
    found: dict[str, FakeImage] = {}

    def open_by_id(io: Any, image_id: str) -> FakeImage:
        if image_id not in found:
            raise rbd.ImageNotFound(f"no image {image_id}")
        return found[image_id]

    monkeypatch.setattr(layering, "open_by_id", open_by_id)
    return found


def test_below_min_nothing_is_listed_or_queued() -> None:
    image, session = FakeImage([(1, TRASH), (2, TRASH)], {1: [child("a")]}), FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=3, max_snapshots=5))
    assert session.flattens == [] and image.listed == []


def test_at_min_the_children_of_the_oldest_snapshots_are_queued_oldest_first() -> None:
    # Listed out of order: the policy goes by snapshot id (creation order), not by listing.
    image = FakeImage([(7, TRASH), (3, TRASH), (5, TRASH)],
                      {3: [child("oldest-a"), child("oldest-b")], 5: [child("middle")], 7: [child("newest")]})
    session = FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=3, max_snapshots=10))
    # 3 snapshots at min 3: one too many, so the oldest snapshot's children are flattened.
    assert session.flattens == ["rbd/oldest-a", "rbd/oldest-b"]
    assert image.current is None, "the image is back at its head"

    session = FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=2, max_snapshots=10))
    assert session.flattens == ["rbd/oldest-a", "rbd/oldest-b", "rbd/middle"], "two over: the two oldest"


def test_user_snapshots_count_but_their_children_are_left_alone() -> None:
    # Snapshot 1 is a cut in progress (a temporary user-namespace snapshot): its clone is being
    # made right now and must not be flattened; it still counts towards the budget.
    image = FakeImage([(1, USER), (2, TRASH), (3, TRASH)], {1: [child("being-cut")], 2: [child("a")], 3: [child("b")]})
    session = FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=2, max_snapshots=10))
    assert session.flattens == ["rbd/a", "rbd/b"] and 1 not in image.listed


def test_over_max_warns_and_still_returns(caplog: pytest.LogCaptureFixture) -> None:
    image = FakeImage([(i, TRASH) for i in range(1, 6)], {i: [child(f"c{i}")] for i in range(1, 6)})
    session = FakeSession(refuse=True)
    with caplog.at_level(logging.WARNING):
        run(image, session, FlattenPolicy(min_snapshots=2, max_snapshots=4))
    assert session.flattens == ["rbd/c1", "rbd/c2", "rbd/c3", "rbd/c4"], "5 at min 2: down to 1 before the new one"
    messages = [r.getMessage() for r in caplog.records]
    assert "image is over its snapshot budget; flattens of its clones are queued" in messages
    assert messages.count("mgr did not take the flatten; the policy retries on the next request") == 4, \
        "a refused flatten is logged, never raised: the request does not wait for or fail on flattens"


def test_children_in_other_pools_and_namespaces_are_named_fully() -> None:
    image = FakeImage([(1, TRASH)], {1: [child("x", pool="ssd", namespace="tenant"), child("y", pool="ssd")]})
    session = FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=1, max_snapshots=2))
    assert session.flattens == ["ssd/tenant/x", "ssd/y"]


def test_a_failed_listing_leaves_the_image_at_its_head() -> None:
    image, session = FakeImage([(1, TRASH)], fail_listing=True), FakeSession()
    with pytest.raises(rbd.Timeout):
        run(image, session, FlattenPolicy(min_snapshots=1, max_snapshots=2))
    assert image.current is None and session.flattens == []


def test_a_child_waiting_in_the_trash_is_freed_through_its_own_clones(opened_by_id: dict[str, FakeImage]) -> None:
    # A deleted snapshot's image waits in the RBD trash for the volume restored from it; the mgr
    # flattens by name only, which a trashed image no longer has. Flattening the restored
    # volume frees it (librbd purges it), and with it the source's snapshot.
    deleted = child("csi-snap-deleted", trash=True)
    opened_by_id["id-csi-snap-deleted"] = FakeImage([(4, TRASH)], {4: [child("csi-vol-restored")]})
    # Two levels: a deleted volume in the trash whose own snapshot image still has a restore.
    opened_by_id["id-csi-vol-deleted"] = FakeImage([(9, TRASH)], {9: [child("csi-snap-x", trash=True)]})
    opened_by_id["id-csi-snap-x"] = FakeImage([(2, TRASH)], {2: [child("csi-vol-grandchild")]})
    image = FakeImage([(1, TRASH), (2, TRASH)], {1: [deleted, child("csi-vol-deleted", trash=True)], 2: [child("young")]})
    session = FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=2, max_snapshots=4))
    assert session.flattens == ["rbd/csi-vol-restored", "rbd/csi-vol-grandchild"]
    assert all(i.closed and i.current is None for i in opened_by_id.values())


def test_a_trashed_child_purged_meanwhile_is_skipped(opened_by_id: dict[str, FakeImage]) -> None:
    image = FakeImage([(1, TRASH)], {1: [child("gone", trash=True), child("live")]})
    session = FakeSession()
    run(image, session, FlattenPolicy(min_snapshots=1, max_snapshots=2))
    assert session.flattens == ["rbd/live"]
