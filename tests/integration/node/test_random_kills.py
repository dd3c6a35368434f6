"""Randomized SIGKILL of the node plugin under load: the crashes the failpoints do not name.

test_restart.py kills the plugin at chosen points of a stage. Here three volumes (ext4, xfs,
raw block) go through stage → publish → unpublish → unstage cycles at once, one worker each (the
kubelet serializes the calls of one volume, not of different ones), and a fourth worker keeps
staging new volumes, so mkfs runs too, while the plugin is
SIGKILLed at random instants and restarted. Kills land inside whatever runs: mkfs, mount,
losetup, the rbd-fuse start, a stage record write. Every call is retried as the kubelet retries
it; only the codes a restarting plugin answers (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED) are
taken for transient, anything else fails the test.

What must hold whatever the kills hit: the data written in the first cycle is read back intact
in every later one (a resumed stage never formats a volume that holds a filesystem), every
call completes, and once all volumes are unstaged nothing is left on the node (mounts, loop
devices, rbd-fuse daemons, work dirs, watchers).
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import pytest

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from tests.integration.controller.helpers import RETRYABLE
from tests.integration.controller.kills import CHANNEL_OPTIONS
from tests.integration.node.conftest import NodeEnv, Volume, assert_no_leftovers, block_cap, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

CYCLES = 4
"""Cycles each volume goes through at least; it goes on cycling until every kill was taken."""
PHASE_DEADLINE_S = 300
"""The kills and the calls around them take 10–30 s; past this something hangs."""
NEW_VOLUME_KINDS = (("ext4", 64), ("xfs", 320))
"""(fsType, MiB) of the volumes one worker keeps making, so that kills also land in mkfs."""
MAX_NEW_VOLUMES = 12
"""Then that worker stops making volumes (each costs an image); the others go on cycling."""
KILLS = 6
PAUSE_S = (0.05, 0.6)
"""Between a restart and the next kill. The workers call back to back, so a kill at a random
instant nearly always finds calls in flight (node calls take 5–500 ms: mkfs and the rbd-fuse
start are the long ones). Killing by time, not by completed calls: workers waiting for a kill
at a call-count threshold would all be idle when it lands."""
BLOCK_OFFSET = 1 << 20
MARKER_FILE = "marker"


def _marker(volume: Volume) -> bytes:
    return f"written once by the first cycle of {volume.image}\n".encode().ljust(4096, b".")


def _write_marker(target: str, cap: csi_pb2.VolumeCapability, data: bytes) -> None:
    if cap.HasField("block"):
        fd = os.open(target, os.O_RDWR)
        try:
            os.pwrite(fd, data, BLOCK_OFFSET)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    path = os.path.join(target, MARKER_FILE)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    directory = os.open(target, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _read_marker(target: str, cap: csi_pb2.VolumeCapability, length: int) -> bytes:
    if cap.HasField("block"):
        fd = os.open(target, os.O_RDONLY)
        try:
            return os.pread(fd, length, BLOCK_OFFSET)
        finally:
            os.close(fd)
    try:
        with open(os.path.join(target, MARKER_FILE), "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return b"<no marker file: the filesystem was made anew>"


@dataclass
class Phase:
    kills: int = 0
    interrupted: int = 0
    """Calls that failed because the plugin died under them, and were retried."""
    killing_done: threading.Event = field(default_factory=threading.Event)
    deadline: float = field(default_factory=lambda: time.monotonic() + PHASE_DEADLINE_S)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _retried(call: Callable[[], object], phase: Phase, deadline: float = 180) -> None:
    """Call until it succeeds, as the kubelet does; only what a restarting plugin answers is
    retried."""
    give_up = time.monotonic() + deadline
    while True:
        try:
            call()
            return
        except grpc.RpcError as error:
            if error.code() not in RETRYABLE or time.monotonic() > give_up:
                raise
            if error.code() is grpc.StatusCode.UNAVAILABLE:
                with phase.lock:
                    phase.interrupted += 1
            time.sleep(0.1)


def _cycle(stub: csi_pb2_grpc.NodeStub, volume: Volume, cap: csi_pb2.VolumeCapability, staging: str, target: str,
           phase: Phase, first: bool) -> None:
    """One pod's use of the volume: stage, publish, write the marker (`first`) or read it back,
    unpublish, unstage; each call retried until it succeeds."""
    marker = _marker(volume)
    _retried(lambda: stub.NodeStageVolume(volume.stage_request(staging, cap), timeout=60), phase)
    _retried(lambda: stub.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
        volume_id=volume.volume_id, staging_target_path=staging, target_path=target, volume_capability=cap),
        timeout=60), phase)
    if first:
        _write_marker(target, cap, marker)
    else:
        found = _read_marker(target, cap, len(marker))
        assert found == marker, f"{volume.image}: the first cycle's data is gone: {found[:80]!r}"
    _retried(lambda: stub.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
        volume_id=volume.volume_id, target_path=target), timeout=60), phase)
    _retried(lambda: stub.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
        volume_id=volume.volume_id, staging_target_path=staging), timeout=60), phase)


def _cycles(env: NodeEnv, stub: csi_pb2_grpc.NodeStub, volume: Volume, cap: csi_pb2.VolumeCapability,
            phase: Phase) -> None:
    """The kubelet's calls for one volume, pod after pod, until the kills are over."""
    staging = env.staging()
    cycle = 0
    while cycle < CYCLES or not phase.killing_done.is_set():
        assert time.monotonic() < phase.deadline, "the kills did not finish"
        _cycle(stub, volume, cap, staging, env.target(), phase, first=cycle == 0)
        cycle += 1


def _new_volumes(env: NodeEnv, stub: csi_pb2_grpc.NodeStub, make_volume: Callable[..., Volume],
                 phase: Phase) -> list[Volume]:
    """Volume after volume, each staged twice: the first stage formats it, so kills also land
    inside mkfs (whose resumed stage must keep what mkfs made, or wait for it), the second
    finds the first one's data."""
    made: list[Volume] = []
    while len(made) < 2 or (not phase.killing_done.is_set() and len(made) < MAX_NEW_VOLUMES):
        fs_type, size_mb = NEW_VOLUME_KINDS[len(made) % len(NEW_VOLUME_KINDS)]
        volume = make_volume(size_mb)
        made.append(volume)
        staging = env.staging()
        for first in (True, False):
            _cycle(stub, volume, mount_cap(fs_type), staging, env.target(), phase, first)
    return made


def _killer(env: NodeEnv, phase: Phase, stop: threading.Event) -> None:
    try:
        while phase.kills < KILLS and not stop.wait(random.uniform(*PAUSE_S)):
            assert env.driver.process is not None
            env.driver.process.kill()  # not DriverProcess.kill: the workers' channel stays open
            env.driver.process.wait()
            phase.kills += 1
            env.driver.start()
    finally:
        phase.killing_done.set()


def test_random_sigkills_during_stage_and_publish_cycles_keep_data_and_leave_nothing(
    env: NodeEnv, make_volume: Callable[..., Volume]
) -> None:
    work = [(make_volume(64), mount_cap("ext4")), (make_volume(320), mount_cap("xfs")), (make_volume(64), block_cap())]
    phase = Phase()
    stop = threading.Event()
    killing = threading.Thread(target=_killer, args=(env, phase, stop))
    with grpc.insecure_channel(env.driver.endpoint, options=CHANNEL_OPTIONS) as channel:
        stub = csi_pb2_grpc.NodeStub(channel)
        killing.start()
        try:
            with ThreadPoolExecutor(len(work) + 1) as pool:
                reused = [pool.submit(_cycles, env, stub, volume, cap, phase) for volume, cap in work]
                fresh = pool.submit(_new_volumes, env, stub, make_volume, phase)
                for done in reused:
                    done.result()
                new_volumes = fresh.result()
        finally:
            stop.set()
            killing.join()
    assert phase.kills == KILLS
    # Without this the test could pass with every kill landing between calls.
    assert phase.interrupted > 0, "no kill landed inside a call"
    assert_no_leftovers(env, *(volume for volume, _ in work), *new_volumes)
