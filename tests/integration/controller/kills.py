"""Randomized SIGKILLs of a controller under load, shared by the random-kill tests.

A phase runs many CSI calls `concurrency` at a time, each retried until it succeeds as a CO
retries it, while a killer thread SIGKILLs the driver at random points of the phase (a random
number of completed calls, then a random few milliseconds, so kills land inside the calls in
flight: in librbd, in journal writes, in lease renewals) and restarts it.
"""
from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from cephcsi._generated import csi_pb2_grpc
from tests.integration.controller.helpers import until_ok
from tests.integration.driver import DriverProcess

Call = Callable[[csi_pb2_grpc.ControllerStub], object]
# Reconnect to the restarted driver quickly (gRPC's default backoff grows to minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 50), ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.min_reconnect_backoff_ms", 50)]
# FAILED_PRECONDITION is retried too, as a provisioner retries it: a driver killed inside
# trash_move leaves its watch on the image until the OSD's watch timeout (30 s), and
# DeleteVolume says so instead of pulling the image from under a possible user.
ALSO_RETRIED = (grpc.StatusCode.FAILED_PRECONDITION,)


@pytest.fixture
def killable(config_file: str, tmp_path: Path) -> Iterator[DriverProcess]:
    """A controller with a short journal lease: a killed holder's lease lapses in 2 s. Its log
    (every incarnation) is kept in the test's tmp_path: a random failure is read from it."""
    process = DriverProcess(config_file, mode="controller", args=["--journal-lock-timeout=2s"])
    process.start()
    try:
        yield process
    finally:
        process.stop()
        if os.path.exists(process.log_path):
            shutil.copy(process.log_path, tmp_path / "driver.log")
        process.cleanup()


class Progress:
    """Completed calls of a phase, so kills are spread over it however fast it runs.

    A call that completes at a kill threshold waits (in its worker) until the killer has taken
    that kill: otherwise a fast phase could finish before the killer thread woke up, and the
    kill would not happen at all (or after the phase)."""

    def __init__(self, thresholds: Sequence[int] = ()) -> None:
        self.done = 0
        self.finished = False
        self.kills_taken = 0
        self.thresholds = sorted(thresholds)
        self.changed = threading.Condition()

    def advance(self) -> None:
        with self.changed:
            self.done += 1
            self.changed.notify_all()
            owed = sum(1 for threshold in self.thresholds if threshold <= self.done)
            self.changed.wait_for(lambda: self.kills_taken >= owed or self.finished, timeout=120)

    def took_kill(self) -> None:
        with self.changed:
            self.kills_taken += 1
            self.changed.notify_all()

    def finish(self) -> None:
        with self.changed:
            self.finished = True
            self.changed.notify_all()

    def wait_for(self, count: int) -> bool:
        with self.changed:
            self.changed.wait_for(lambda: self.done >= count or self.finished, timeout=300)
            return self.done >= count and not self.finished


def _killer(driver: DriverProcess, progress: Progress, thresholds: Sequence[int], jitter: float, kills: list[int]) -> None:
    for threshold in thresholds:
        if not progress.wait_for(threshold):
            return
        time.sleep(random.uniform(0, jitter))
        assert driver.process is not None
        driver.process.kill()  # not DriverProcess.kill: the callers' channel stays open
        driver.process.wait()
        kills.append(progress.done)
        progress.took_kill()
        driver.start()


def run_phase(
    driver: DriverProcess,
    calls: Sequence[Call],
    kills_per_phase: int,
    concurrency: int = 16,
    deadline: float = 180,
    jitter: float = 0.02,
) -> tuple[list[object], list[int]]:
    """Run `calls` with `kills_per_phase` random SIGKILLs; returns (results, completed-call
    counts at each kill)."""
    margin = max(1, len(calls) // 10)
    thresholds = sorted(random.sample(range(margin, len(calls) - margin), kills_per_phase))
    progress = Progress(thresholds)
    kills: list[int] = []
    killer = threading.Thread(target=_killer, args=(driver, progress, thresholds, jitter, kills))

    def run(call: Call, stub: csi_pb2_grpc.ControllerStub) -> object:
        result = until_ok(lambda: call(stub), deadline=deadline, also=ALSO_RETRIED)
        progress.advance()
        return result

    with grpc.insecure_channel(driver.endpoint, options=CHANNEL_OPTIONS) as channel:
        stub = csi_pb2_grpc.ControllerStub(channel)
        killer.start()
        try:
            with ThreadPoolExecutor(concurrency) as pool:
                results = list(pool.map(lambda call: run(call, stub), calls))
        finally:
            progress.finish()
            killer.join()
    return results, kills
