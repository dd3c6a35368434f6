"""Probe must answer while every worker is busy with slow calls (cephcsi.csi.server).

A real gRPC server on a unix socket; the slow calls block on an event, so the test knows when
every worker is taken without guessing at timings. The Probe deadline is only the verdict.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.csi.identity import IdentityOptions, IdentityServicer
from cephcsi.csi.server import CSIServer

pytestmark = pytest.mark.unit

WORKERS = 3
VERDICT = 5.0  # seconds; Probe answers in milliseconds when it is not starved


class SlowController(csi_pb2_grpc.ControllerServicer):
    """CreateVolume holds its worker until `release` is set."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def CreateVolume(self, request: csi_pb2.CreateVolumeRequest, context: object) -> csi_pb2.CreateVolumeResponse:
        self.entered.release()
        self.release.wait(60)
        return csi_pb2.CreateVolumeResponse(volume=csi_pb2.Volume(volume_id=request.name))


@dataclass
class Running:
    server: CSIServer
    controller: SlowController
    channel: grpc.Channel

    def create(self, name: str) -> grpc.Future[csi_pb2.CreateVolumeResponse]:
        stub = csi_pb2_grpc.ControllerStub(self.channel)
        future: grpc.Future[csi_pb2.CreateVolumeResponse] = stub.CreateVolume.future(
            csi_pb2.CreateVolumeRequest(name=name), timeout=60)
        return future

    def occupy_every_worker(self) -> list[grpc.Future[csi_pb2.CreateVolumeResponse]]:
        calls = [self.create(f"slow-{n}") for n in range(WORKERS)]
        for _ in range(WORKERS):
            assert self.controller.entered.acquire(timeout=30), "a slow call never started"
        return calls


@pytest.fixture
def running() -> Iterator[Running]:
    directory = tempfile.mkdtemp(prefix="adm-", dir="/tmp")  # unix socket paths are short
    controller = SlowController()
    identity = IdentityServicer(IdentityOptions(driver_name="rbd.csi.ceph.com", controller=True, topology=False))
    server = CSIServer(f"unix://{directory}/csi.sock", WORKERS, [
        lambda s: csi_pb2_grpc.add_IdentityServicer_to_server(identity, s),
        lambda s: csi_pb2_grpc.add_ControllerServicer_to_server(controller, s),
    ])
    server.start()
    channel = grpc.insecure_channel(f"unix://{server.path}")
    try:
        yield Running(server, controller, channel)
    finally:
        controller.release.set()
        channel.close()
        server.stop(5)
        shutil.rmtree(directory, ignore_errors=True)


def test_probe_and_identity_calls_answer_while_every_worker_is_busy(running: Running) -> None:
    calls = running.occupy_every_worker()
    identity = csi_pb2_grpc.IdentityStub(running.channel)
    for _ in range(3 * WORKERS):  # more probes than any spare thread the pool might have
        assert identity.Probe(csi_pb2.ProbeRequest(), timeout=VERDICT).ready.value
    assert identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=VERDICT).name == "rbd.csi.ceph.com"
    assert identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=VERDICT).capabilities
    running.controller.release.set()
    assert [c.result(timeout=30).volume.volume_id for c in calls] == [f"slow-{n}" for n in range(WORKERS)]


def test_a_call_beyond_the_limit_is_refused_at_once_with_a_retry_message(running: Running) -> None:
    calls = running.occupy_every_worker()
    with pytest.raises(grpc.RpcError) as refused:
        running.create("one-too-many").result(timeout=VERDICT)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    details = refused.value.details() or ""
    assert "busy" in details and "retry" in details
    assert "CreateVolume" in details and "--grpc-workers" in details
    running.controller.release.set()
    for call in calls:
        call.result(timeout=30)
    # The slots come back: a new call runs.
    assert running.create("after").result(timeout=30).volume.volume_id == "after"
