"""Clone-chain depth follows the parent of the snapshot a child reads through, read from the
image headers (cls_rbd parent_overlap_get / parent_get), encoded as Ceph encodes them."""
from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import pytest
import rados

from cephcsi.ceph import layering
from cephcsi.ceph.connection import Session

pytestmark = pytest.mark.unit

NOSNAP = layering.CEPH_NOSNAP


def spec(pool_id: int, namespace: str, image_id: str, snap_id: int) -> bytes:
    """A ParentImageSpec as cls_rbd encodes it (ENCODE_START(1, 1) header + fields)."""
    body = struct.pack("<q", pool_id)
    for text in (namespace, image_id):
        body += struct.pack("<I", len(text)) + text.encode()
    body += struct.pack("<Q", snap_id)
    return struct.pack("<BBI", 1, 1, len(body)) + body


def overlap(value: int | None) -> bytes:
    return b"\x00" if value is None else b"\x01" + struct.pack("<Q", value)


class Header:
    """One image's header: its parent (pool 1 unless said) and which of head/snapshots read through it."""

    def __init__(self, parent: tuple[str, int] | None, reading: set[int], pool: int = 1, namespace: str = "") -> None:
        self.parent, self.reading, self.pool, self.namespace = parent, reading, pool, namespace


class FakeIoctx:
    def __init__(self, headers: dict[str, Header], pool_id: int = 1, namespace: str = "") -> None:
        self.headers, self.pool_id, self.namespace = headers, pool_id, namespace
        self.calls: list[tuple[str, str]] = []

    def get_pool_id(self) -> int:
        return self.pool_id

    def get_namespace(self) -> str:
        return self.namespace

    def execute(self, key: str, cls: str, method: str, data: bytes, length: int = 8192) -> tuple[int, bytes]:
        assert cls == "rbd" and key.startswith("rbd_header.")
        self.calls.append((key, method))
        header = self.headers.get(key.removeprefix("rbd_header."))
        if header is None:
            raise rados.ObjectNotFound("no header")
        if method == "parent_overlap_get":
            (snap_id,) = struct.unpack("<Q", data)
            if snap_id != NOSNAP and snap_id not in header.reading and snap_id > 100:
                raise rados.ObjectNotFound("no such snapshot")  # ids above 100: snapshots that do not exist
            return 0, overlap(1 << 30 if header.parent and snap_id in header.reading else None)
        assert method == "parent_get" and data == b""
        if header.parent is None:
            return 0, spec(-1, "", "", NOSNAP)
        return 0, spec(header.pool, header.namespace, header.parent[0], header.parent[1])


class FakeSession:
    def __init__(self, pools: dict[int, FakeIoctx]) -> None:
        self.pools = pools

    def pool_name(self, pool_id: int) -> str | None:
        return str(pool_id) if pool_id in self.pools else None

    @contextmanager
    def ioctx(self, pool: str, namespace: str | None = None) -> Iterator[FakeIoctx]:
        yield self.pools[int(pool)]


def depth(session: FakeSession, io: FakeIoctx, image_id: str) -> int:
    return layering.depth(cast(Session, session), cast(rados.Ioctx, io), image_id)


def test_decoders_read_what_cls_rbd_encodes() -> None:
    assert layering.decode_parent_spec(spec(3, "ns", "abc", 7)) == layering.HeaderParent(3, "ns", "abc", 7)
    assert layering.decode_parent_spec(spec(-1, "", "", NOSNAP)) is None
    assert layering.decode_overlap(overlap(None)) is None
    assert layering.decode_overlap(overlap(4096)) == 4096
    assert layering.decode_overlap(overlap(0)) == 0  # a parent with nothing overlapping is still a parent


def test_a_child_of_a_snapshot_taken_before_its_image_was_flattened_counts_the_old_chain() -> None:
    # base ← s1 (snapshot image; its restore point 2 reads through base@1) ← v (restored
    # volume, flattened since without deep-flatten: its head is flat, its snapshot 3 still
    # reads through s1@2) ← s2 (cut from v@3).
    io = FakeIoctx({
        "base": Header(None, set()),
        "s1": Header(("base", 1), {NOSNAP, 2}),
        "v": Header(("s1", 2), {3}),
        "s2": Header(("v", 3), {NOSNAP}),
    })
    session = FakeSession({1: io})
    assert depth(session, io, "s2") == 3
    assert depth(session, io, "v") == 0
    # Two reads per level, one for the flat end: no image is opened.
    io.calls.clear()
    depth(session, io, "s2")
    assert len(io.calls) == 7


def test_a_parent_snapshot_not_listed_falls_back_to_the_parents_head() -> None:
    io = FakeIoctx({"a": Header(None, set()), "b": Header(("a", 5), {NOSNAP}), "c": Header(("b", 999), {NOSNAP})})
    assert depth(FakeSession({1: io}), io, "c") == 2


def test_a_purged_parent_ends_the_chain() -> None:
    io = FakeIoctx({"c": Header(("gone", 1), {NOSNAP})})
    assert depth(FakeSession({1: io}), io, "c") == 1


def test_parents_in_other_pools_and_namespaces_are_followed_and_a_deleted_pool_ends_the_chain() -> None:
    ssd = FakeIoctx({"p": Header(("q", 4), {NOSNAP, 2}, pool=9)}, pool_id=2, namespace="tenant")
    io = FakeIoctx({"c": Header(("p", 2), {NOSNAP}, pool=2, namespace="tenant")})
    assert depth(FakeSession({1: io, 2: ssd}), io, "c") == 2  # p's parent lives in pool 9, which is gone
