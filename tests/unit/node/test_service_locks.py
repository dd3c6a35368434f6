"""Per-volume and per-path locks: a busy key is ABORTED at once, other volumes run in parallel."""
from __future__ import annotations

import threading

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.cli.node_wiring import build_node_service
from cephcsi.errors import OperationInFlight
from cephcsi.node.mappers.select import NodeProbe
from cephcsi.node.requests import StageRequest, VolumeAccess
from cephcsi.node.service import NodeConfig, NodeService
from cephcsi.node.stage_record import ImageSpec
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit


class BlockingStager:
    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.running = 0
        self.peak = 0
        self._lock = threading.Lock()

    def stage(self, request: StageRequest) -> None:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.entered.release()
        self.release.wait(5)
        with self._lock:
            self.running -= 1


def _service() -> tuple[NodeService, BlockingStager]:
    config = NodeConfig("n1", "rbd.csi.ceph.com", "", "/tmp/unused", "fuse", (), 0, 1.0, 10.0, 5.0)
    service = build_node_service(config, runner=FakeRunner(), labels=None, probe=NodeProbe())
    stager = BlockingStager()
    service.stager = stager  # type: ignore[assignment]
    return service, stager


def _request(volume: str, path: str) -> StageRequest:
    return StageRequest(volume, path, "c", "m", ImageSpec("rbd", volume), Credentials("u", "k"), VolumeAccess("mount", "ext4"))


def test_same_volume_is_aborted_and_others_run_in_parallel() -> None:
    service, stager = _service()
    threads = [threading.Thread(target=service.stage, args=(_request(f"v{i}", f"/s{i}"),)) for i in range(3)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert stager.entered.acquire(timeout=5)
    assert stager.peak == 3  # three volumes inside stage at once: no global lock
    with pytest.raises(OperationInFlight, match="volume 'v0'"):
        service.stage(_request("v0", "/other"))
    with pytest.raises(OperationInFlight, match="path '/s1'"):
        service.stage(_request("v9", "/s1"))
    stager.release.set()
    for thread in threads:
        thread.join(5)
    service.stage(_request("v0", "/s0"))  # free again
