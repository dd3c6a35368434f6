"""The auth tests use the node tests' plugin process and volumes (tests/integration/node/conftest.py)
and a controller process of their own, so its log holds only what these tests made it do."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import env, make_volume, node_env  # noqa: F401 - fixtures used here too


@pytest.fixture(scope="module")
def controller(ceph_cluster: CephTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    config = ceph_cluster.write_config(tmp_path_factory.mktemp("auth") / "config.json")
    process = DriverProcess(config, mode="controller", args=["--client-mount-timeout=5"])
    process.start()
    try:
        yield process
    finally:
        process.cleanup()
