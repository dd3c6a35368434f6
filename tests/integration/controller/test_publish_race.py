"""Issue 34's publish race: two ControllerPublishVolume calls of one single-node-writer volume to
two nodes, fired together, never both succeed — within one controller process (its per-volume
lock), and across two processes (two replicas right after a leader change, or a stale leader),
where only the atomicity of the record's write on the image header can decide.

Every round: exactly one call succeeds; the other is FAILED_PRECONDITION naming the winner (or
ABORTED: the same process had the volume in flight); the header records exactly the winner;
unpublishing the winner lets the loser's node publish. The cross-process rounds are run twice:
as the calls come (a real race, whose window is small), and with both processes paused for
0.2 s between reading the holders and writing their record (failpoint
`publish.before-record`), which makes both read "nobody holds it" in every round — a guard
that is not atomic with the write lets both succeed there every time."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph import image_metadata
from cephcsi.ceph.publish_keys import ADDRESS_PREFIX
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, mount_cap
from tests.integration.controller.pool_state import admin_ioctx
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

NODES = ("node-a", "node-b")
PAUSED = {"CEPHCSI_FAILPOINTS": "publish.before-record:pause=0.2"}


@dataclass(frozen=True)
class Outcome:
    node: str
    code: grpc.StatusCode  # OK for a success
    details: str


def publish(driver: DriverProcess, cluster: CephTestCluster, volume: str, node: str) -> None:
    driver.controller.ControllerPublishVolume(csi_pb2.ControllerPublishVolumeRequest(
        volume_id=volume, node_id=node, volume_capability=mount_cap(), secrets=cluster.secrets), timeout=60)


def unpublish(driver: DriverProcess, cluster: CephTestCluster, volume: str, node: str) -> None:
    driver.controller.ControllerUnpublishVolume(csi_pb2.ControllerUnpublishVolumeRequest(
        volume_id=volume, node_id=node, secrets=cluster.secrets), timeout=60)


def race(cluster: CephTestCluster, volume: str, first: DriverProcess, second: DriverProcess) -> list[Outcome]:
    """Publish to node-a through `first` and node-b through `second`, released together."""
    start = threading.Barrier(2)
    outcomes: list[Outcome] = []

    def call(driver: DriverProcess, node: str) -> None:
        start.wait()
        try:
            publish(driver, cluster, volume, node)
            outcomes.append(Outcome(node, grpc.StatusCode.OK, ""))
        except grpc.RpcError as error:
            outcomes.append(Outcome(node, error.code(), error.details() or ""))

    threads = [threading.Thread(target=call, args=(d, n)) for d, n in zip((first, second), NODES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert len(outcomes) == 2, "a publish did not answer"
    return outcomes


@pytest.fixture
def recorded(ceph_cluster: CephTestCluster) -> Iterator[Callable[[str], list[str]]]:
    """The nodes the image's header records as holding the volume (read as the controller reads it)."""
    with admin_ioctx(ceph_cluster) as io:
        def read(volume: str) -> list[str]:
            found = image_metadata.read(io, image_of(volume))
            own = f"{ADDRESS_PREFIX}{volume}/"
            return sorted(key[len(own):] for key in found if key.startswith(own))
        yield read


def run_rounds(cluster: CephTestCluster, volume: str, pairs: list[tuple[DriverProcess, DriverProcess]],
               recorded: Callable[[str], list[str]], label: str) -> dict[str, int]:
    """Race each pair once; returns how often each loser code was seen."""
    seen: dict[str, int] = {}
    for round_no, (first, second) in enumerate(pairs):
        where = f"{label} round {round_no}"
        outcomes = race(cluster, volume, first, second)
        winners = [o for o in outcomes if o.code == grpc.StatusCode.OK]
        assert len(winners) == 1, f"{where}: {outcomes} (both or neither published)"
        winner = winners[0].node
        loser = next(o for o in outcomes if o.code != grpc.StatusCode.OK)
        assert loser.code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ABORTED), f"{where}: {loser}"
        if loser.code == grpc.StatusCode.FAILED_PRECONDITION:
            assert f"published to node {winner}" in loser.details, f"{where}: {loser.details}"
        seen[loser.code.name] = seen.get(loser.code.name, 0) + 1
        assert recorded(volume) == [winner], f"{where}: the header records {recorded(volume)}, {winner} won"
        # The winner's unpublish (through the other process) lets the loser's node have it.
        unpublish(second, cluster, volume, winner)
        assert recorded(volume) == []
        publish(first, cluster, volume, loser.node)
        assert recorded(volume) == [loser.node]
        unpublish(second, cluster, volume, loser.node)
        assert recorded(volume) == [], f"{where}: not released"
    return seen


def test_two_processes_racing_a_single_node_publish_never_both_win(
        driver: DriverProcess, fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster,
        recorded: Callable[[str], list[str]]) -> None:
    other = fresh_driver()
    paused_a, paused_b = fresh_driver(env=PAUSED), fresh_driver(env=PAUSED)
    volume = driver.controller.CreateVolume(create_request(ceph_cluster)).volume.volume_id
    try:
        # Both processes read "nobody holds it" before either writes: only the guarded write decides.
        forced = run_rounds(ceph_cluster, volume, [(paused_a, paused_b), (paused_b, paused_a)] * 4, recorded,
                            "paused")
        assert forced == {"FAILED_PRECONDITION": 8}, forced
        # As the calls come, across processes and within one.
        run_rounds(ceph_cluster, volume, [(driver, other), (other, driver)] * 8, recorded, "two processes")
        same = run_rounds(ceph_cluster, volume, [(driver, driver), (other, other)] * 4, recorded, "one process")
        assert set(same) <= {"FAILED_PRECONDITION", "ABORTED"}
    finally:
        for node in NODES:
            unpublish(driver, ceph_cluster, volume, node)
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume, secrets=ceph_cluster.secrets))
