"""Batch's bookkeeping of librados read ops, without a cluster (pure logic)."""
from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import pytest
import rados

from cephcsi.ceph import batch
from cephcsi.errors import CephCSIError

pytestmark = pytest.mark.unit


class FakeOp:
    made: list[FakeOp] = []

    def __init__(self) -> None:
        self.releases = 0
        FakeOp.made.append(self)

    def create(self) -> None:
        pass

    def release(self) -> None:
        self.releases += 1


class RefusingIo:
    """An ioctx whose submissions fail, as librados refuses an op on a shut-down client."""

    def get_omap_vals(self, op: FakeOp, *_: Any) -> tuple[Iterator[tuple[str, bytes]], None]:
        return iter(()), None

    def operate_aio_read_op(self, op: FakeOp, obj: str, flag: int = 0) -> None:
        raise rados.OSError("submission refused", errno=errno.ESHUTDOWN)


@pytest.fixture
def fake_ops(monkeypatch: pytest.MonkeyPatch) -> list[FakeOp]:
    FakeOp.made = []
    monkeypatch.setattr(rados, "ReadOp", FakeOp)
    return FakeOp.made


def test_an_op_whose_submission_fails_is_released_once_and_not_waited_for(fake_ops: list[FakeOp]) -> None:
    reads = batch.Batch(RefusingIo())  # type: ignore[arg-type]
    with pytest.raises(CephCSIError):
        reads.omap("csi.volume.x")
    (op,) = fake_ops
    assert op.releases == 1
    reads.wait()  # nothing was submitted: nothing to wait for, nothing released twice
    assert op.releases == 1
