"""The flatten policy's knobs on real Ceph: past --maxsnapshotsonimage the children of a
source's oldest snapshots are flattened by mgr tasks while the request that noticed it returns
at once, and a snapshot past --rbdhardmaxclonedepth is not ready until its flatten finished.

Both tests build their starting state with the module's driver (default limits, so nothing is
flattened) and then make one request through a driver started with tight limits: the state the
policy meets is then known, not a race with the mgr."""
from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request, image_of
from tests.integration.controller.pool_state import read_pool, wait_for_pool
from tests.integration.controller.snapshot_helpers import (
    BLOCK,
    delete_all,
    depth,
    from_snapshot,
    from_volume,
    pattern,
    read,
    read_chain,
    snapshot_count,
    snapshot_request,
    wait_for,
    write,
)
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

# A request that flattened on its path would still be quick for these 16 MiB images, so the
# background is shown by the state right after the answer; this bound only catches a request
# that waits for the mgr (its tasks start seconds later) or retries until flattens end.
QUICK = 5.0


def _timed(call: Callable[[], object]) -> float:
    began = time.monotonic()
    call()
    return time.monotonic() - began


def test_past_max_snapshots_the_oldest_children_are_flattened_in_the_background(
    driver: DriverProcess, fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    c = driver.controller
    source = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    data = pattern("budget")
    write(ceph_cluster, source.volume_id, data)
    source_image = image_of(source.volume_id)
    # Three children, each holding one snapshot on the source: a snapshot that was deleted
    # while a volume restored from it lives (its image waits in the RBD trash), a PVC clone,
    # and a snapshot.
    deleted = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    restored = c.CreateVolume(from_snapshot(ceph_cluster, deleted.snapshot_id, size=16 * MiB), timeout=60).volume
    c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=deleted.snapshot_id, secrets=ceph_cluster.secrets), timeout=60)
    clone = c.CreateVolume(from_volume(ceph_cluster, source.volume_id, size=16 * MiB), timeout=60).volume
    third = c.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot
    assert snapshot_count(ceph_cluster, source_image) == 3

    limited = fresh_driver(args=("--minsnapshotsonimage=2", "--maxsnapshotsonimage=3"))
    fourth: list[csi_pb2.Snapshot] = []
    # 3 snapshots >= max: over budget. It is logged, the oldest 2 children's flattens are queued,
    # and the request answers (no ABORTED: any error would raise here).
    took = _timed(lambda: fourth.append(
        limited.controller.CreateSnapshot(snapshot_request(ceph_cluster, source.volume_id), timeout=60).snapshot))
    assert took < QUICK and fourth[0].ready_to_use
    newest = limited.controller.CreateVolume(from_volume(ceph_cluster, source.volume_id, size=16 * MiB), timeout=60).volume
    assert "image is over its snapshot budget" in limited.log()

    third_image, fourth_image = image_of(third.snapshot_id, "csi-snap-"), image_of(fourth[0].snapshot_id, "csi-snap-")
    assert wait_for(lambda: snapshot_count(ceph_cluster, source_image) == 2, timeout=90), \
        f"source keeps {snapshot_count(ceph_cluster, source_image)} snapshots:\n{limited.log()[-4000:]}"
    # The deleted snapshot's image was freed by flattening the volume restored from it; the
    # clone and the older snapshot were flattened; the two newest children still share data.
    assert [read_chain(ceph_cluster, image_of(v)) for v in (restored.volume_id, clone.volume_id)] == [0, 0]
    assert read_chain(ceph_cluster, third_image) == 0
    assert [depth(ceph_cluster, n) for n in (fourth_image, image_of(newest.volume_id))] == [1, 1]
    for volume_id in (restored.volume_id, clone.volume_id, newest.volume_id):
        assert read(ceph_cluster, volume_id, BLOCK) == data
    delete_all(limited, ceph_cluster, [third.snapshot_id, fourth[0].snapshot_id],
               [restored.volume_id, clone.volume_id, newest.volume_id, source.volume_id])
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline


def test_a_snapshot_past_the_hard_depth_is_ready_only_once_flattened(
    driver: DriverProcess, fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    c = driver.controller
    volume = c.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume
    data = pattern("deep")
    write(ceph_cluster, volume.volume_id, data)
    volumes, snapshots = [volume.volume_id], []
    for _generation in range(2):  # volume → snapshot → restore, twice: the last restore is at depth 4
        snapshots.append(c.CreateSnapshot(snapshot_request(ceph_cluster, volumes[-1]), timeout=60).snapshot.snapshot_id)
        volumes.append(c.CreateVolume(from_snapshot(ceph_cluster, snapshots[-1], size=16 * MiB), timeout=60).volume.volume_id)
    assert depth(ceph_cluster, image_of(volumes[-1])) == 4

    limited = fresh_driver(args=("--rbdsoftmaxclonedepth=1", "--rbdhardmaxclonedepth=2"))
    request = snapshot_request(ceph_cluster, volumes[-1])
    deep = limited.controller.CreateSnapshot(request, timeout=60).snapshot
    snapshots.append(deep.snapshot_id)
    # Depth 5 > 2: cut at once, but not ready; the depth is measured before the flatten is
    # queued, so this answer cannot race the mgr.
    assert not deep.ready_to_use and deep.size_bytes == 16 * MiB and deep.creation_time.seconds > 0

    def ready() -> bool:
        listed = limited.controller.ListSnapshots(
            csi_pb2.ListSnapshotsRequest(snapshot_id=deep.snapshot_id, secrets=ceph_cluster.secrets), timeout=60)
        return bool(listed.entries[0].snapshot.ready_to_use)

    deep_image = image_of(deep.snapshot_id, "csi-snap-")
    assert wait_for(ready, timeout=90), limited.log()[-4000:]
    assert read_chain(ceph_cluster, deep_image) <= 2, "ready only once the chain is within the hard limit"
    again = limited.controller.CreateSnapshot(request, timeout=60).snapshot
    assert again.snapshot_id == deep.snapshot_id and again.ready_to_use, "the snapshotter's retry sees it ready"
    restored = limited.controller.CreateVolume(from_snapshot(ceph_cluster, deep.snapshot_id, size=16 * MiB), timeout=60).volume
    volumes.append(restored.volume_id)
    assert read(ceph_cluster, restored.volume_id, BLOCK) == data
    delete_all(limited, ceph_cluster, snapshots, volumes)
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline
