"""Monitors down before the driver's first connect: every queued call fails within about one
client_mount_timeout (connects are single-flight and a failure is remembered), and the same
process serves again once the monitors are back."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

MOUNT_TIMEOUT = 3
CALLS = 32
# One attempt (MOUNT_TIMEOUT), the joiners' grace (1 s), and scheduling slack on a busy CI box.
BOUND = MOUNT_TIMEOUT + 3.0


@pytest.fixture
def monitors_down(ceph_cluster: CephTestCluster) -> Iterator[Callable[[], None]]:
    """Stops the monitors; yields a function that starts them again (also run on teardown)."""
    running = [True]

    def start() -> None:
        if not running[0]:
            ceph_cluster.start_mon()
            running[0] = True

    ceph_cluster.stop_mon()
    running[0] = False
    try:
        yield start
    finally:
        start()


def _timed_create(driver: DriverProcess, request: csi_pb2.CreateVolumeRequest) -> tuple[float, grpc.StatusCode, str]:
    started = time.monotonic()
    try:
        driver.controller.CreateVolume(request, timeout=4 * BOUND)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
    return time.monotonic() - started, code, details


def _create_until_ok(driver: DriverProcess, request: csi_pb2.CreateVolumeRequest, within: float) -> csi_pb2.Volume:
    deadline = time.monotonic() + within
    while True:
        try:
            volume: csi_pb2.Volume = driver.controller.CreateVolume(request, timeout=30).volume
            return volume
        except grpc.RpcError as error:
            assert error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), (
                f"{error.details()}\n{driver.log()[-4000:]}")
            assert time.monotonic() < deadline, f"no recovery within {within:.0f}s: {error.details()}"
            time.sleep(0.5)


def test_monitors_down_before_the_first_connect_fail_every_call_within_one_mount_timeout(
    config_file: str, ceph_cluster: CephTestCluster, monitors_down: Callable[[], None]
) -> None:
    driver = DriverProcess(config_file, mode="controller", args=[
        f"--client-mount-timeout={MOUNT_TIMEOUT}", "--rados-osd-op-timeout=5", "--rados-mon-op-timeout=5",
        f"--grpc-workers={CALLS}",
    ])
    driver.start()
    try:
        requests = [create_request(ceph_cluster) for _ in range(CALLS)]
        with ThreadPoolExecutor(max_workers=CALLS) as pool:
            outcomes = list(pool.map(lambda r: _timed_create(driver, r), requests))
        codes = {code for _, code, _ in outcomes}
        print("seconds per call:", sorted(round(e, 2) for e, _, _ in outcomes), "codes:", sorted(c.name for c in codes))
        slowest = max(elapsed for elapsed, _, _ in outcomes)
        assert codes <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}, outcomes
        assert slowest <= BOUND, (
            f"the slowest of {CALLS} calls took {slowest:.1f}s with client_mount_timeout={MOUNT_TIMEOUT}s: "
            f"{sorted(round(e, 1) for e, _, _ in outcomes)}"
        )
        assert all("Ceph cluster" in details and "monitors" in details for _, _, details in outcomes), outcomes

        pid = driver.process.pid if driver.process else None
        monitors_down()
        volume = _create_until_ok(driver, requests[0], within=60)
        assert driver.process is not None and driver.process.poll() is None and driver.process.pid == pid
        driver.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    finally:
        driver.cleanup()
