"""The cls_rbd decoders check what they read (cephcsi.ceph.encoding.read_versioned): the known
encodings decode, a newer version whose compat allows it decodes as Ceph decodes it (the new
fields skipped), and a newer compat, a short value or an unknown enum value is UnknownEncoding,
never a guess. Bytes as cls_rbd encodes them (src/cls/rbd/cls_rbd_types.cc)."""
from __future__ import annotations

import struct

import pytest

from cephcsi.ceph import encoding, layering, trash_move
from cephcsi.ceph.encoding import UnknownEncoding
from cephcsi.ceph.imagestate import TrashEntry, TrashState, decode_trash_entry
from cephcsi.ceph.layering import HeaderParent, decode_overlap, decode_parent_spec

pytestmark = pytest.mark.unit


def _versioned(body: bytes, version: int, compat: int) -> bytes:
    return bytes([version, compat]) + struct.pack("<I", len(body)) + body


def _trash_body(name: str = "csi-vol-1", state: int | None = 1, source: int = 0) -> bytes:
    body = bytes([source]) + encoding.string(name) + struct.pack("<IIII", 10, 20, 10, 20)
    return body + (bytes([state]) if state is not None else b"")


def _parent_body(pool: int = 3, namespace: str = "", image_id: str = "abc123", snap: int = 7) -> bytes:
    return struct.pack("<q", pool) + encoding.string(namespace) + encoding.string(image_id) + struct.pack("<Q", snap)


# --- TrashImageSpec: ENCODE_START(2, 1) -----------------------------------------------------

def test_the_known_trash_entry_encodings_decode() -> None:
    assert decode_trash_entry("i", _versioned(_trash_body(), 2, 1)) == TrashEntry("i", "csi-vol-1", TrashState.MOVING)
    assert decode_trash_entry("i", _versioned(_trash_body(state=None), 1, 1)).state is TrashState.NORMAL


def test_what_the_hand_move_writes_decodes() -> None:
    raw = trash_move.trash_spec("csi-vol-9", TrashState.REMOVING, 1_700_000_000.25)
    assert decode_trash_entry("i", raw) == TrashEntry("i", "csi-vol-9", TrashState.REMOVING, 0)


def test_a_newer_version_readable_by_version_two_skips_its_new_fields() -> None:
    raw = _versioned(_trash_body(state=0) + b"\x99new-field", 3, 2)
    assert decode_trash_entry("i", raw) == TrashEntry("i", "csi-vol-1", TrashState.NORMAL)


@pytest.mark.parametrize("raw, said", [
    (_versioned(_trash_body(), 3, 3), "compat 3"),
    (_versioned(_trash_body(), 9, 9), "compat 9"),
    (_versioned(_trash_body(state=7), 2, 1), "trash state 7"),
    (_versioned(_trash_body(source=9), 2, 1), "trash source 9"),
    (_versioned(_trash_body(state=None), 2, 1), "ends before"),
    (_versioned(_trash_body(), 2, 1)[:-3], "claims"),
    (b"\x02\x01\x00", "shorter"),
    (_versioned(b"\x00" + struct.pack("<I", 500) + b"x", 2, 1), "runs past"),
])
def test_an_unknown_or_broken_trash_entry_is_refused(raw: bytes, said: str) -> None:
    with pytest.raises(UnknownEncoding) as caught:
        decode_trash_entry("i", raw)
    assert said in caught.value.message and "'i'" in caught.value.message


# --- ParentImageSpec: ENCODE_START(1, 1); parent_overlap_get: std::optional<u64> -------------

def test_the_known_parent_link_decodes() -> None:
    assert decode_parent_spec(_versioned(_parent_body(), 1, 1)) == HeaderParent(3, "", "abc123", 7)
    assert decode_parent_spec(_versioned(_parent_body(pool=-1, image_id="", snap=layering.CEPH_NOSNAP), 1, 1)) is None


def test_a_newer_parent_link_with_compat_one_decodes() -> None:
    assert decode_parent_spec(_versioned(_parent_body(namespace="ns") + b"extra", 2, 1)) == \
        HeaderParent(3, "ns", "abc123", 7)


@pytest.mark.parametrize("raw", [
    _versioned(_parent_body(), 2, 2),
    _versioned(_parent_body()[:-2], 1, 1),
    _versioned(_parent_body(), 1, 1)[:10],
])
def test_an_unknown_or_broken_parent_link_is_refused(raw: bytes) -> None:
    with pytest.raises(UnknownEncoding):
        decode_parent_spec(raw)


def test_the_overlap_decodes_and_refuses_other_shapes() -> None:
    assert decode_overlap(b"") is None
    assert decode_overlap(b"\x00") is None
    assert decode_overlap(b"\x01" + struct.pack("<Q", 4096)) == 4096
    for raw in (b"\x02" + bytes(8), b"\x01" + bytes(4), b"\x00" + bytes(8)):
        with pytest.raises(UnknownEncoding):
            decode_overlap(raw)


# --- librbd's rbd_trash notify (trash_watcher NotifyMessage v1) ------------------------------

def test_the_trash_notify_payload_is_versioned_with_op_id_and_entry() -> None:
    spec = trash_move.trash_spec("csi-vol-1", TrashState.NORMAL, 5.0)
    raw = trash_move.trash_watcher_payload("abc", spec)
    message = encoding.read_versioned(raw, "notify", 1)
    assert (message.version, raw[1], message.end) == (1, 1, len(raw))
    assert struct.unpack_from("<I", raw, message.start)[0] == trash_move.NOTIFY_OP_IMAGE_ADDED
    image_id, offset = encoding.read_string(raw, message.start + 4)
    assert image_id == "abc" and raw[offset:] == spec
    assert decode_trash_entry("abc", raw[offset:]).state is TrashState.NORMAL
