"""The layout librbd would give a new image in a pool (its object size, no data pool, no striping),
or None when that layout is not the plain one; a pool's overrides are trusted for `TTL_SECONDS`.
Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import rados

from cephcsi.ceph import omap
from cephcsi.ceph.errors import ceph_call

INFO_OBJECT = "rbd_info"
ORDER = "rbd_default_order"
LAYOUT_OPTIONS = (ORDER, "rbd_default_data_pool", "rbd_default_stripe_unit", "rbd_default_stripe_count")
POOL_OVERRIDE_PREFIX = "metadata_conf_"
"""How `rbd config pool set` names an option in `rbd_info`'s omap (pool metadata `conf_<option>`,
which cls_rbd keeps under a `metadata_` prefix)."""
TTL_SECONDS = 30.0
MIN_ORDER, MAX_ORDER = 12, 25
"""librbd's accepted range of object sizes: 4 KiB to 32 MiB."""


class PoolDefaults:
    """Per connection: the plain layout of each pool, with the time it was read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._overridden: dict[int, tuple[bool, float]] = {}
        self._lock = threading.Lock()  # held for no Ceph operation

    def plain_order(self, handle: rados.Rados, io: rados.Ioctx) -> int | None:
        """The order a new image in `io`'s pool gets, when the pool's layout is the plain one."""
        order = _client_plain_order(handle)
        if order is None or self._pool_overrides_layout(io):
            return None
        return order

    def _pool_overrides_layout(self, io: rados.Ioctx) -> bool:
        pool_id = io.get_pool_id()
        now = self._clock()
        with self._lock:
            known = self._overridden.get(pool_id)
        if known is not None and now - known[1] < TTL_SECONDS:
            return known[0]
        keys = tuple(POOL_OVERRIDE_PREFIX + option for option in LAYOUT_OPTIONS)
        with ceph_call("read pool configuration", f"pool {io.get_pool_name()!r}"):
            namespace = io.get_namespace()
            io.set_namespace("")  # pool overrides live in the default namespace's rbd_info
            try:
                found = omap.read_raw(io, INFO_OBJECT, keys) or {}
            finally:
                io.set_namespace(namespace)
        overridden = bool(found)
        with self._lock:
            self._overridden[pool_id] = (overridden, now)
        return overridden


def _client_plain_order(handle: rados.Rados) -> int | None:
    """The client configuration's order, or None when it asks for a data pool or striping."""
    try:
        order = int(handle.conf_get(ORDER) or "")
    except ValueError:
        return None
    if (handle.conf_get("rbd_default_data_pool") or "") != "":
        return None
    for option in ("rbd_default_stripe_unit", "rbd_default_stripe_count"):
        if (handle.conf_get(option) or "0") not in ("0", "0B"):
            return None
    return order if MIN_ORDER <= order <= MAX_ORDER else None
