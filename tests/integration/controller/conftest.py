from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from cephcsi.ceph.leases import LeaseKeeper
from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess


@pytest.fixture(scope="module")
def config_file(ceph_cluster: CephTestCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    return ceph_cluster.write_config(tmp_path_factory.mktemp("cfg") / "config.json")


@pytest.fixture(scope="module")
def driver(config_file: str) -> Iterator[DriverProcess]:
    process = DriverProcess(config_file, mode="controller",
                            args=["--rados-osd-op-timeout=5", "--rados-mon-op-timeout=5", "--client-mount-timeout=5"])
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


@pytest.fixture
def fresh_driver(config_file: str) -> Iterator[Callable[..., DriverProcess]]:
    """Factory for drivers a test may kill; all are stopped afterwards."""
    started: list[DriverProcess] = []

    def make(env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> DriverProcess:
        # A short journal lease: a test that kills a driver waits this long for its lease to lapse.
        process = DriverProcess(config_file, mode="controller", env=env or {},
                                args=["--journal-lock-timeout=2s", *args])
        started.append(process)
        return process.start()

    yield make
    for process in started:
        process.cleanup()


@pytest.fixture
def keeper() -> Iterator[LeaseKeeper]:
    """The journal lease keeper of a VolumeManager a test builds in its own process (the
    driver's composition root builds one per process); releases behind answers are drained."""
    made = LeaseKeeper()
    yield made
    made.drain(10)
