"""Randomized SIGKILLs while snapshots, restores and clones are created and deleted under load.

Like test_random_kills, but for the snapshot and clone paths: the driver is killed at random
instants while 16 calls run at once, restarted, and every call retried until it succeeds.
Afterwards the data must be right (each snapshot and clone reads what its source held) and,
once everything is deleted — sources before their dependents — the pool must be exactly as
before: no image, temporary snapshot, trash entry or journal key left.
"""
from __future__ import annotations

from collections.abc import Sequence

import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import (
    BLOCK,
    from_snapshot,
    from_volume,
    pattern,
    read,
    snapshot_request,
    write,
)
from tests.integration.controller.kills import Call, killable, run_phase
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

SOURCES = 16
CONCURRENCY = 16
__all__ = ["killable"]  # the fixture, imported for pytest


def _phase(driver: DriverProcess, calls: Sequence[Call]) -> tuple[list[object], list[int]]:
    # Snapshot calls are slower than creates: fewer kills, a longer retry deadline, wider jitter.
    return run_phase(driver, calls, kills_per_phase=2, concurrency=CONCURRENCY, deadline=240, jitter=0.05)


def test_random_sigkills_during_snapshots_restores_clones_and_deletes(
    killable: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    c = killable.controller
    sources = [c.CreateVolume(create_request(ceph_cluster, size=8 * MiB), timeout=60).volume.volume_id for _ in range(SOURCES)]
    data = {vid: pattern(vid[-8:]) for vid in sources}
    for vid, block in data.items():
        write(ceph_cluster, vid, block)

    snap_requests = [snapshot_request(ceph_cluster, vid) for vid in sources]
    clone_requests = [from_volume(ceph_cluster, vid) for vid in sources]
    made, kills_create = _phase(killable, [_snapshot(r) for r in snap_requests] + [_create(r) for r in clone_requests])
    snapshots = [m.snapshot for m in made[:SOURCES]]  # type: ignore[attr-defined]
    clones = [m.volume.volume_id for m in made[SOURCES:]]  # type: ignore[attr-defined]
    assert [s.source_volume_id for s in snapshots] == sources
    restore_requests = [from_snapshot(ceph_cluster, s.snapshot_id) for s in snapshots]
    restored, kills_restore = _phase(killable, [_create(r) for r in restore_requests])
    restores = [r.volume.volume_id for r in restored]  # type: ignore[attr-defined]
    for index, vid in enumerate(sources):
        assert read(ceph_cluster, clones[index], BLOCK) == data[vid], f"clone of {vid}"
        assert read(ceph_cluster, restores[index], BLOCK) == data[vid], f"restore from a snapshot of {vid}"

    secrets = ceph_cluster.secrets
    # Sources first, then snapshots, then dependents: every parent is deleted while it has children.
    deletes = [_delete_volume(v, secrets) for v in sources]
    deletes += [_delete_snapshot(snap.snapshot_id, secrets) for snap in snapshots]
    deletes += [_delete_volume(v, secrets) for v in clones + restores]
    _, kills_delete = _phase(killable, deletes)
    after = wait_for_pool(ceph_cluster, baseline, timeout=240)
    assert after == baseline, f"left behind after kills at {kills_create} / {kills_restore} / {kills_delete}"


def _snapshot(request: csi_pb2.CreateSnapshotRequest) -> Call:
    return lambda stub: stub.CreateSnapshot(request, timeout=60)


def _create(request: csi_pb2.CreateVolumeRequest) -> Call:
    return lambda stub: stub.CreateVolume(request, timeout=60)


def _delete_volume(volume_id: str, secrets: dict[str, str]) -> Call:
    request = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=secrets)
    return lambda stub: stub.DeleteVolume(request, timeout=60)


def _delete_snapshot(snapshot_id: str, secrets: dict[str, str]) -> Call:
    request = csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=secrets)
    return lambda stub: stub.DeleteSnapshot(request, timeout=60)
