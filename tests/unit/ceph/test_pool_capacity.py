"""The room left in a pool from `ceph df` and `osd pool get-quota` answers (pure logic)."""
from __future__ import annotations

import pytest

from cephcsi.ceph.pool_capacity import parse
from cephcsi.errors import Internal

pytestmark = pytest.mark.unit
MiB = 1 << 20


def test_without_a_quota_the_room_is_max_avail() -> None:
    room = parse("rbd", {"max_avail": 900 * MiB, "stored": 5 * MiB, "objects": 3},
                 {"quota_max_bytes": 0, "quota_max_objects": 0, "current_num_bytes": 5 * MiB})
    assert room.quota_room is None and room.available == 900 * MiB


def test_a_byte_quota_caps_it_by_what_is_stored() -> None:
    room = parse("rbd", {"max_avail": 900 * MiB}, {"quota_max_bytes": 100 * MiB, "current_num_bytes": 30 * MiB})
    assert room.available == 70 * MiB
    # A quota larger than the free space does not raise the answer.
    assert parse("rbd", {"max_avail": 50 * MiB}, {"quota_max_bytes": 100 * MiB}).available == 50 * MiB
    # Over quota (the mon lets writes in flight finish) is no room, not a negative one.
    assert parse("rbd", {"max_avail": 50 * MiB}, {"quota_max_bytes": MiB, "current_num_bytes": 2 * MiB}).available == 0


def test_a_release_without_current_counts_uses_dfs_own() -> None:
    room = parse("rbd", {"max_avail": 900 * MiB, "stored": 40 * MiB, "objects": 10},
                 {"quota_max_bytes": 100 * MiB, "quota_max_objects": 10})
    assert room.stored_bytes == 40 * MiB and room.objects == 10
    assert room.objects_exhausted and room.available == 0


def test_an_object_quota_counts_only_once_reached() -> None:
    room = parse("rbd", {"max_avail": 900 * MiB}, {"quota_max_objects": 10, "current_num_objects": 9})
    assert not room.objects_exhausted and room.available == 900 * MiB


def test_an_answer_without_max_avail_is_an_error_that_says_so() -> None:
    with pytest.raises(Internal, match="no max_avail for pool 'rbd'"):
        parse("rbd", {"stored": 1}, {})
