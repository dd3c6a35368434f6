"""A pool's fitness for RBD images, checked once per connection instead of once per image (the
handles run with `rbd_validate_pool=false`; an unvalidated pool still gets librbd's validation).
Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import rados

from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import CephCSIError, FailedPrecondition
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

INFO_OBJECT = "rbd_info"
VALIDATED = b"overwrite validated"
"""What librbd leaves in `rbd_info` once a pool passed its validation."""
OPTION = "rbd_validate_pool"


class PoolValidation:
    """The pools one connection knows to be validated, and the switch for those it does not."""

    def __init__(self) -> None:
        self._validated: set[int] = set()
        # Guards the set and the count of validating creates; held for no Ceph operation
        # (conf_set only changes the handle's in-memory config).
        self._lock = threading.Lock()
        self._validating = 0

    def known(self, pool_id: int) -> bool:
        with self._lock:
            return pool_id in self._validated

    def validated(self, handle: rados.Rados, io: rados.Ioctx) -> bool:
        """Whether `io`'s pool is validated for RBD images (`rbd_info` read once if not known)."""
        pool_id = io.get_pool_id()
        return self.known(pool_id) or self._read_validated(handle, io.get_pool_name(), pool_id)

    @contextmanager
    def creating(self, handle: rados.Rados, io: rados.Ioctx, data_pool: str | None) -> Iterator[None]:
        """Around one create or clone into `io` (with `data_pool`): librbd validates the pool
        only when this connection has not seen it validated."""
        pool = data_pool if data_pool and data_pool != io.get_pool_name() else io.get_pool_name()
        pool_id = io.get_pool_id() if pool == io.get_pool_name() else _pool_id(handle, pool)
        if pool_id is not None and (self.known(pool_id) or self._read_validated(handle, pool, pool_id)):
            yield
            return
        log.info("pool not validated for RBD yet: librbd validates it with this create", extra=fields(pool=pool))
        self._switch(handle, +1)
        try:
            yield
        except CephCSIError as error:
            if pool_id is not None and not self._validated_after(handle, pool, pool_id):
                raise FailedPrecondition(
                    f"pool {pool!r} cannot hold RBD images: librbd's validation of it failed ({error.message}). "
                    "An RBD pool needs self-managed snapshots (no pool snapshots made with `ceph osd pool mksnap`) "
                    "and, when erasure-coded, `ceph osd pool set <pool> allow_ec_overwrites true`; then run "
                    "`rbd pool init <pool>`"
                ) from error
            raise
        finally:
            self._switch(handle, -1)

    def _read_validated(self, handle: rados.Rados, pool: str, pool_id: int) -> bool:
        with ceph_call("read pool validation", f"pool {pool!r}"):
            io = handle.open_ioctx2(pool_id)
            try:
                io.set_namespace("")
                content = io.read(INFO_OBJECT, len(VALIDATED) + 1)
            except rados.ObjectNotFound:
                return False
            finally:
                io.close()
        if content != VALIDATED:
            return False
        with self._lock:
            self._validated.add(pool_id)
        return True

    def _validated_after(self, handle: rados.Rados, pool: str, pool_id: int) -> bool:
        """Whether the pool is validated now; True when that cannot be read (the create's own
        error then stands, instead of a guess)."""
        try:
            return self._read_validated(handle, pool, pool_id)
        except CephCSIError:
            return True

    def _switch(self, handle: rados.Rados, step: int) -> None:
        with self._lock:
            self._validating += step
            # Set on every start, not only the first: the connection may have reopened its
            # handle since, and the new one starts with validation off.
            if step > 0 or self._validating == 0:
                handle.conf_set(OPTION, "true" if self._validating else "false")


def _pool_id(handle: rados.Rados, pool: str) -> int | None:
    """The pool's id, or None when there is no such pool (librbd's create then says so)."""
    with ceph_call("look up pool", f"pool {pool!r}"):
        found = handle.pool_lookup(pool)
    return None if found is None or found < 0 else int(found)
