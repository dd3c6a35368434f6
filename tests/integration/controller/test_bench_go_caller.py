"""bench/'s gRPC side calls the controller from Go (bench/grpccaller, via bench.go_caller): built
from its sources, it makes real CreateVolume / DeleteVolume batches at a concurrency against a real
controller, answers with what the section tabulates, and reports failed calls as figures."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import go_caller, procstat
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

SIZE = 8 << 20


def _caller(driver: DriverProcess, cluster: CephTestCluster, parameters: dict[str, str] | None = None,
            ) -> go_caller.GoCaller:
    assert driver.process is not None
    pid = driver.process.pid
    return go_caller.GoCaller(driver.endpoint, cluster.parameters if parameters is None else parameters,
                              cluster.secrets, SIZE, 60.0, server_clock=lambda: procstat.cpu_seconds(pid))


def test_built_once_per_source() -> None:
    first = go_caller.build()
    assert first.is_file() and os.access(first, os.X_OK)
    assert go_caller.source_key() in str(first)
    assert go_caller.build() == first  # cached: the same binary, not rebuilt


def test_batches_create_and_delete_at_a_concurrency(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    caller = _caller(driver, ceph_cluster)
    names = [f"go-caller-{i}" for i in range(6)]

    created = caller.create(names, 3)
    assert created.batch.errors == []
    assert len(created.batch.latencies) == len(created.batch.results) == 6
    assert len(set(created.batch.results)) == 6
    assert created.batch.concurrency == 3
    assert 0 < max(created.batch.latencies) <= created.batch.wall_s
    assert created.caller_cpu_s is not None and created.caller_cpu_s >= 0
    assert created.driver_cpu_s > 0  # the controller's clock moved over the calls

    # CreateVolume is idempotent: the same names from a new caller process answer the same volumes.
    again = caller.create(names, 2)
    assert sorted(again.batch.results) == sorted(created.batch.results)

    deleted = caller.delete(created.batch.results, 3)
    assert deleted.batch.errors == []
    assert sorted(deleted.batch.results) == sorted(created.batch.results)
    wait_for_pool(ceph_cluster, baseline)


def test_failed_calls_are_counted_not_raised(driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    caller = _caller(driver, ceph_cluster, parameters={**ceph_cluster.parameters, "imageFeatures": "no-such-feature"})
    done = caller.create(["go-caller-bad-0", "go-caller-bad-1"], 2)
    assert done.batch.results == [] and done.batch.latencies == []
    assert len(done.batch.errors) == 2
    assert all("InvalidArgument" in error for error in done.batch.errors), done.batch.errors
    wait_for_pool(ceph_cluster, baseline)


def test_an_unreachable_controller_is_a_clear_error(tmp_path: Path, ceph_cluster: CephTestCluster) -> None:
    caller = go_caller.GoCaller(f"unix://{tmp_path}/nothing.sock", ceph_cluster.parameters, ceph_cluster.secrets,
                                SIZE, 5.0, server_clock=lambda: 0.0)
    with pytest.raises(go_caller.CallerError, match="did not connect"):
        caller.create(["never"], 1)
