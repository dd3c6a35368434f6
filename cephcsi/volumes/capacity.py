"""Volume sizes: what CreateVolume allocates for a capacity range.

Images are sized in whole MiB (ceph-csi does the same), so a request is rounded up; the
result must still respect the limit.
"""
from __future__ import annotations

from cephcsi.errors import InvalidArgument, OutOfRange

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_SIZE = GiB


def round_up(size: int, unit: int = MiB) -> int:
    return -(-size // unit) * unit


def choose_size(required: int, limit: int) -> int:
    """Bytes to allocate for `capacity_range` (0 means unset, as in the protobuf)."""
    if required < 0 or limit < 0:
        raise InvalidArgument("capacity_range: required_bytes and limit_bytes must not be negative")
    if limit and required > limit:
        raise OutOfRange(f"capacity_range: required_bytes {required} exceeds limit_bytes {limit}")
    if required == 0:
        size = min(DEFAULT_SIZE, limit - limit % MiB) if limit else DEFAULT_SIZE
    else:
        size = round_up(required)
    if size == 0 or (limit and size > limit):
        raise OutOfRange(
            f"capacity_range [{required}, {limit or 'unbounded'}] holds no whole MiB; "
            "RBD volumes are allocated in MiB"
        )
    return size


def fits(size: int, required: int, limit: int) -> bool:
    """Whether an existing volume of `size` satisfies a (repeated) request."""
    return size >= required and (limit == 0 or size <= limit)
