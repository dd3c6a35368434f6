"""Fixtures shared by the audit's integration tests."""
from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.integration.audit.seed import write_config
from tests.integration.driver import DriverProcess

Drivers = tuple[str, str, Callable[..., DriverProcess]]


@pytest.fixture
def drivers(tmp_path: Path, ceph_cluster: CephTestCluster) -> Iterator[Drivers]:
    """(namespace, config, start): controller drivers working in a fresh rados namespace."""
    namespace = f"audit-{uuidlib.uuid4().hex[:8]}"
    config = write_config(ceph_cluster, str(tmp_path / "config.json"), namespace)
    started: list[DriverProcess] = []

    def start(env: dict[str, str] | None = None) -> DriverProcess:
        # A short lease: a killed driver's lapses 2 s later, so the audit judges (and may repair) its debris.
        process = DriverProcess(config, mode="controller", env=env or {}, args=["--journal-lock-timeout=2s"])
        started.append(process)
        return process.start()

    yield namespace, config, start
    for process in started:
        process.cleanup()
