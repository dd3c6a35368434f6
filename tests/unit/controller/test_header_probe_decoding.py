"""The header probe's reading of cls_rbd's encoded SnapContext (cephcsi.ceph.dependents)."""
from __future__ import annotations

import pytest

from cephcsi.ceph.batch import UNKNOWN_NOTIFY
from cephcsi.ceph import dependents

pytestmark = pytest.mark.unit


def test_snapshot_count_is_read_after_the_sequence_number() -> None:
    assert dependents._snapshot_count(bytes(12)) == 0
    two = (7).to_bytes(8, "little") + (2).to_bytes(4, "little") + (5).to_bytes(8, "little") + (6).to_bytes(8, "little")
    assert dependents._snapshot_count(two) == 2


def test_a_short_reply_is_not_taken_for_no_snapshots() -> None:
    assert dependents._snapshot_count(b"") is None
    assert dependents._snapshot_count(bytes(11)) is None


def test_the_notify_payload_is_an_encoded_message_with_an_unknown_op() -> None:
    raw = UNKNOWN_NOTIFY.encode("ascii")  # the binding sends a str's UTF-8 bytes: ASCII is unchanged
    version, compat, length = raw[0], raw[1], int.from_bytes(raw[2:6], "little")
    assert (version, compat, length) == (1, 1, len(raw) - 6)
    op = int.from_bytes(raw[6:10], "little")
    assert op > 0xFF  # librbd's NotifyOps are small numbers; this is none of them
