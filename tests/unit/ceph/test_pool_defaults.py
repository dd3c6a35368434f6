"""cephcsi.ceph.pool_defaults on fake handles: which client settings and pool overrides make a
layout plain, and how long a pool's overrides are trusted. Against a real pool:
tests/integration/controller/test_image_writes.py."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from cephcsi.ceph import pool_defaults
from cephcsi.ceph.pool_defaults import PoolDefaults

pytestmark = pytest.mark.unit

PLAIN = {"rbd_default_order": "22", "rbd_default_data_pool": "", "rbd_default_stripe_unit": "0",
         "rbd_default_stripe_count": "0"}


@dataclass
class FakeHandle:
    conf: dict[str, str] = field(default_factory=lambda: dict(PLAIN))

    def conf_get(self, option: str) -> str | None:
        return self.conf.get(option)


@dataclass
class FakeIoctx:
    overrides: dict[str, bytes] = field(default_factory=dict)
    reads: int = 0
    namespace: str = "tenant"

    def get_pool_id(self) -> int:
        return 7

    def get_pool_name(self) -> str:
        return "rbd"

    def get_namespace(self) -> str:
        return self.namespace

    def set_namespace(self, namespace: str) -> None:
        self.namespace = namespace


@pytest.fixture
def io(monkeypatch: pytest.MonkeyPatch) -> FakeIoctx:
    fake = FakeIoctx()

    def read_raw(io: FakeIoctx, obj: str, keys: tuple[str, ...]) -> dict[str, bytes]:
        assert obj == "rbd_info" and io.namespace == "", "overrides live in the default namespace"
        io.reads += 1
        return {key: value for key, value in io.overrides.items() if key in keys}

    monkeypatch.setattr("cephcsi.ceph.omap.read_raw", read_raw)
    return fake


def test_the_configured_order_of_a_plain_layout(io: FakeIoctx) -> None:
    handle = FakeHandle({**PLAIN, "rbd_default_order": "23"})
    assert PoolDefaults().plain_order(handle, io) == 23  # type: ignore[arg-type]
    assert io.namespace == "tenant"


@pytest.mark.parametrize("option, value", [
    ("rbd_default_data_pool", "ec-data"),
    ("rbd_default_stripe_unit", "65536"),
    ("rbd_default_stripe_count", "4"),
    ("rbd_default_order", "26"),
    ("rbd_default_order", "x"),
])
def test_a_client_setting_librbd_applies_otherwise_is_not_plain(io: FakeIoctx, option: str, value: str) -> None:
    assert PoolDefaults().plain_order(FakeHandle({**PLAIN, option: value}), io) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("option", pool_defaults.LAYOUT_OPTIONS)
def test_a_pool_override_of_the_layout_is_not_plain(io: FakeIoctx, option: str) -> None:
    io.overrides = {f"{pool_defaults.POOL_OVERRIDE_PREFIX}{option}": b"1"}
    assert PoolDefaults().plain_order(FakeHandle(), io) is None  # type: ignore[arg-type]


def test_a_pools_overrides_are_read_again_after_the_ttl(io: FakeIoctx) -> None:
    now = [1000.0]
    defaults, handle = PoolDefaults(clock=lambda: now[0]), FakeHandle()
    assert defaults.plain_order(handle, io) == 22  # type: ignore[arg-type]
    io.overrides = {f"{pool_defaults.POOL_OVERRIDE_PREFIX}rbd_default_order": b"23"}
    now[0] += pool_defaults.TTL_SECONDS - 1
    assert defaults.plain_order(handle, io) == 22  # type: ignore[arg-type]
    assert io.reads == 1
    now[0] += 2
    assert defaults.plain_order(handle, io) is None  # type: ignore[arg-type]
    assert io.reads == 2
