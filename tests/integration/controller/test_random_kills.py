"""Randomized SIGKILL under load: the crashes nobody thought of.

The failpoint tests kill the driver between its own steps; here it is killed at random
instants while 100 creates, then 100 deletes, run 16 at a time, so kills land inside librbd
calls, subprocesses of the gRPC stack, lock renewals, anywhere. Every call is retried until
it succeeds, as a provisioner does. Afterwards the pool must be exactly as before: no image,
no directory entry, no trash entry (once the mgr purged), no journal key or record.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, until_ok
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

VOLUMES = 100
CONCURRENCY = 16
KILLS_PER_PHASE = 3
# Reconnect to the restarted driver quickly (gRPC's default backoff grows to minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.min_reconnect_backoff_ms", 50)]


@pytest.fixture
def killable(config_file: str) -> Iterator[DriverProcess]:
    process = DriverProcess(config_file, mode="controller", args=["--journal-lock-timeout=2s"])
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


class Progress:
    """Completed calls of a phase, so kills are spread over it however fast it runs."""

    def __init__(self) -> None:
        self.done = 0
        self.finished = False
        self.changed = threading.Condition()

    def advance(self) -> None:
        with self.changed:
            self.done += 1
            self.changed.notify_all()

    def finish(self) -> None:
        with self.changed:
            self.finished = True
            self.changed.notify_all()

    def wait_for(self, count: int) -> bool:
        with self.changed:
            self.changed.wait_for(lambda: self.done >= count or self.finished, timeout=300)
            return not self.finished


def _kill_at_random(driver: DriverProcess, progress: Progress, kills: list[int]) -> None:
    """SIGKILL the driver at KILLS_PER_PHASE random points of the phase (a random number of
    completed calls, then a random few milliseconds, to land inside the calls in flight),
    restarting it each time."""
    for threshold in sorted(random.sample(range(5, VOLUMES - 10), KILLS_PER_PHASE)):
        if not progress.wait_for(threshold):
            return
        time.sleep(random.uniform(0, 0.02))
        assert driver.process is not None
        driver.process.kill()  # not DriverProcess.kill: the callers' channel stays open
        driver.process.wait()
        kills.append(progress.done)
        driver.start()


def _run_phase(driver: DriverProcess, calls: list[Callable[[csi_pb2_grpc.ControllerStub], object]]) -> tuple[list[object], list[int]]:
    progress = Progress()
    kills: list[int] = []
    killer = threading.Thread(target=_kill_at_random, args=(driver, progress, kills))

    def run(call: Callable[[csi_pb2_grpc.ControllerStub], object], stub: csi_pb2_grpc.ControllerStub) -> object:
        result = until_ok(lambda: call(stub), deadline=180)
        progress.advance()
        return result

    with grpc.insecure_channel(driver.endpoint, options=CHANNEL_OPTIONS) as channel:
        stub = csi_pb2_grpc.ControllerStub(channel)
        killer.start()
        try:
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                results = list(pool.map(lambda call: run(call, stub), calls))
        finally:
            progress.finish()
            killer.join()
    return results, kills


def test_random_sigkills_during_creates_and_deletes_leave_the_pool_as_it_was(
    killable: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    requests = [create_request(ceph_cluster) for _ in range(VOLUMES)]

    created, create_kills = _run_phase(
        killable, [lambda stub, r=r: stub.CreateVolume(r, timeout=30) for r in requests]
    )
    volume_ids = [response.volume.volume_id for response in created]  # type: ignore[attr-defined]
    assert len(set(volume_ids)) == VOLUMES, "one volume per name"
    during = read_pool(ceph_cluster)
    images = {name for name in during.directory if name.startswith("csi-vol-")}
    assert images == {f"csi-vol-{vid[-36:]}" for vid in volume_ids}, "exactly one image per name, none extra"
    assert len(create_kills) == KILLS_PER_PHASE, f"kills during the create phase: {create_kills}"

    deletes = [csi_pb2.DeleteVolumeRequest(volume_id=vid, secrets=ceph_cluster.secrets) for vid in volume_ids]
    _, delete_kills = _run_phase(killable, [lambda stub, d=d: stub.DeleteVolume(d, timeout=30) for d in deletes])
    assert len(delete_kills) == KILLS_PER_PHASE, f"kills during the delete phase: {delete_kills}"

    # The mgr purges the trash one image at a time, and waits out watches of killed clients.
    after = wait_for_pool(ceph_cluster, baseline, timeout=150)
    assert after == baseline, f"left behind after kills at {create_kills} / {delete_kills}"
