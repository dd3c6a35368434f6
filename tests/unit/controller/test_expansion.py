"""ControllerExpandVolume's size decisions (pure)."""
from __future__ import annotations

import pytest

from cephcsi.errors import InvalidArgument, OutOfRange
from cephcsi.volumes.capacity import MiB
from cephcsi.volumes.expansion import check_current, target_size

pytestmark = pytest.mark.unit


def test_target_rounds_up_to_whole_mib_like_create() -> None:
    assert target_size(MiB, 0) == MiB
    assert target_size(MiB + 1, 0) == 2 * MiB
    assert target_size(0, 5 * MiB + 7) == 5 * MiB


@pytest.mark.parametrize("required, limit, error", [
    (0, 0, InvalidArgument), (-1, 0, InvalidArgument), (0, 100, OutOfRange), (3 * MiB, 2 * MiB, OutOfRange),
    (MiB + 1, MiB + 2, OutOfRange),
])
def test_target_refuses_what_no_mib_fits(required: int, limit: int, error: type[Exception]) -> None:
    with pytest.raises(error):
        target_size(required, limit)


def test_grow_only_when_smaller_and_never_shrink() -> None:
    assert check_current("v", MiB, 2 * MiB, 0) is True
    assert check_current("v", 2 * MiB, 2 * MiB, 0) is False  # a repeated call
    assert check_current("v", 4 * MiB, 2 * MiB, 0) is False  # asked for less than there is: OK, current size
    with pytest.raises(OutOfRange, match="never shrunk"):
        check_current("v", 4 * MiB, 2 * MiB, 3 * MiB)
