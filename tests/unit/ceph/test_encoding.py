"""Ceph's wire encoding as cephcsi builds it for class calls (cephcsi.ceph.encoding)."""
from __future__ import annotations

import struct

import pytest

from cephcsi.ceph import encoding, image_metadata
from cephcsi.errors import Internal

pytestmark = pytest.mark.unit


def test_a_string_map_is_a_count_then_sorted_length_prefixed_pairs() -> None:
    raw = encoding.string_map({"pv": "pvc-1", "ns": "é"})
    assert raw[:4] == struct.pack("<I", 2)
    key, at = encoding.read_string(raw, 4)
    value, at = encoding.read_string(raw, at)
    assert (key, value) == ("ns", "é"), "std::map order: by key"
    key, at = encoding.read_string(raw, at)
    value, at = encoding.read_string(raw, at)
    assert (key, value, at) == ("pv", "pvc-1", len(raw))
    assert encoding.string_map({}) == struct.pack("<I", 0)


def test_librbd_configuration_keys_are_never_set_by_hand() -> None:
    # Checked before any I/O: `io` is never touched.
    with pytest.raises(Internal, match="conf_"):
        image_metadata.set_on_new(None, "img", {"conf_rbd_cache": "false"})  # type: ignore[arg-type]
