"""An admin I/O context on the test pool, for tests that drive Ceph objects directly."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import rados

from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.pool_state import admin_ioctx


@pytest.fixture
def io(ceph_cluster: CephTestCluster) -> Iterator[rados.Ioctx]:
    with admin_ioctx(ceph_cluster) as ioctx:
        yield ioctx
