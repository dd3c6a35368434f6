"""cephcsi.ceph.pool_validation's bookkeeping, on a fake handle: which pool is read, when the
handle's validation is switched on and off, and what a failed validation becomes. Real librbd
behaviour: tests/integration/controller/test_pool_validation.py."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import rados

from cephcsi.ceph.pool_validation import OPTION, VALIDATED, PoolValidation
from cephcsi.errors import FailedPrecondition, Internal

pytestmark = pytest.mark.unit


@dataclass
class FakeIoctx:
    pools: dict[int, str]
    pool_id: int
    info: dict[int, bytes]
    reads: list[tuple[int, str]]
    namespace: str = "ns"

    def get_pool_id(self) -> int:
        return self.pool_id

    def get_pool_name(self) -> str:
        return self.pools[self.pool_id]

    def set_namespace(self, namespace: str) -> None:
        self.namespace = namespace

    def read(self, key: str, length: int) -> bytes:
        self.reads.append((self.pool_id, self.namespace))
        if self.pool_id not in self.info:
            raise rados.ObjectNotFound("no rbd_info")
        return self.info[self.pool_id][:length]

    def close(self) -> None:
        pass


@dataclass
class FakeHandle:
    pools: dict[int, str] = field(default_factory=lambda: {1: "rbd", 2: "ec-data"})
    info: dict[int, bytes] = field(default_factory=dict)
    reads: list[tuple[int, str]] = field(default_factory=list)
    settings: list[str] = field(default_factory=list)

    def ioctx(self, pool_id: int) -> FakeIoctx:
        return FakeIoctx(self.pools, pool_id, self.info, self.reads)

    def open_ioctx2(self, pool_id: int) -> FakeIoctx:
        return self.ioctx(pool_id)

    def pool_lookup(self, name: str) -> int | None:
        return next((i for i, n in self.pools.items() if n == name), None)

    def conf_set(self, option: str, value: str) -> None:
        assert option == OPTION
        self.settings.append(value)


def test_a_validated_pool_is_read_once_and_never_switches_validation_on() -> None:
    handle, pools = FakeHandle(info={1: VALIDATED}), PoolValidation()
    for _ in range(3):
        with pools.creating(handle, handle.ioctx(1), None):  # type: ignore[arg-type]
            pass
    assert handle.reads == [(1, "")]  # rbd_info lives in the default namespace
    assert handle.settings == []


def test_an_unvalidated_pool_switches_validation_on_around_the_create_and_is_read_again_next_time() -> None:
    handle, pools = FakeHandle(), PoolValidation()
    with pools.creating(handle, handle.ioctx(1), None):  # type: ignore[arg-type]
        assert handle.settings == ["true"]
        handle.info[1] = VALIDATED  # what librbd's validation writes
    assert handle.settings == ["true", "false"]
    with pools.creating(handle, handle.ioctx(1), None):  # type: ignore[arg-type]
        pass
    assert handle.settings == ["true", "false"] and len(handle.reads) == 2 and pools.known(1)


def test_validation_stays_on_until_the_last_of_overlapping_creates_ends() -> None:
    handle, pools = FakeHandle(), PoolValidation()
    first = pools.creating(handle, handle.ioctx(1), None)  # type: ignore[arg-type]
    second = pools.creating(handle, handle.ioctx(2), None)  # type: ignore[arg-type]
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert handle.settings == ["true", "true"]
    second.__exit__(None, None, None)
    assert handle.settings == ["true", "true", "false"]


def test_a_data_pool_is_the_pool_checked() -> None:
    handle, pools = FakeHandle(info={2: VALIDATED}), PoolValidation()
    with pools.creating(handle, handle.ioctx(1), "ec-data"):  # type: ignore[arg-type]
        pass
    assert handle.reads == [(2, "")] and handle.settings == []
    with pools.creating(handle, handle.ioctx(1), "rbd"):  # type: ignore[arg-type]  # the image's own pool named as data pool
        pass
    assert handle.reads[-1] == (1, "") and handle.settings == ["true", "false"]


def test_a_failed_create_in_a_pool_still_unvalidated_is_a_failed_precondition() -> None:
    handle, pools = FakeHandle(), PoolValidation()
    with pytest.raises(FailedPrecondition, match=r"pool 'rbd' cannot hold RBD images.*rbd pool init"):
        with pools.creating(handle, handle.ioctx(1), None):  # type: ignore[arg-type]
            raise Internal("create image 'x' failed: InvalidArgument")
    assert handle.settings == ["true", "false"]


def test_a_failed_create_in_a_pool_validated_meanwhile_keeps_its_own_error() -> None:
    handle, pools = FakeHandle(), PoolValidation()
    with pytest.raises(Internal, match="no space"):
        with pools.creating(handle, handle.ioctx(1), None):  # type: ignore[arg-type]
            handle.info[1] = VALIDATED
            raise Internal("no space")


def test_a_missing_data_pool_is_left_to_librbd_to_report() -> None:
    handle, pools = FakeHandle(), PoolValidation()
    with pytest.raises(Internal, match="does not exist"):
        with pools.creating(handle, handle.ioctx(1), "gone"):  # type: ignore[arg-type]
            raise Internal("data pool does not exist")
    assert handle.reads == [] and handle.settings == ["true", "false"]
