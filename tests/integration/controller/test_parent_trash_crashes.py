"""A delete of a clone parent killed inside librbd's `RBD.remove`, after the image left the
directory but before its trash entry was marked NORMAL.

The random SIGKILL test found this shape (a DeleteSnapshot of a snapshot image with restored
volumes, retried for ever with NOT_FOUND): librbd resumes an interrupted move by name only for
entries of source USER, and a parent's entry has source USER_PARENT. Killing `RBD.remove` of a
parent at random instants (Ceph 16) leaves it in about 1 of 150 kills, too rarely to wait for
here, so the test writes the same shape with cls_rbd's own state change after a kill at the
step right after the removal (the `snapshot.delete.after-image` failpoint): trash entry
MOVING, source USER_PARENT, no directory entry, no id object, header present.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph import imagestate, trash
from cephcsi.ceph.imagestate import TrashState
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, create_request, until_ok
from tests.integration.controller.pool_state import admin_ioctx, read_pool, wait_for_pool
from tests.integration.audit.seed import run_audit
from tests.integration.controller.snapshot_helpers import (
    BLOCK,
    from_snapshot,
    from_volume,
    pattern,
    read,
    snapshot_request,
    write,
)
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def _trash_state(cluster: CephTestCluster, image_id: str) -> imagestate.TrashEntry | None:
    with admin_ioctx(cluster) as io:
        return imagestate.trash_entry(io, image_id)


def _back_to_moving(cluster: CephTestCluster, image_id: str) -> None:
    with admin_ioctx(cluster) as io:
        trash.set_state(io, image_id, TrashState.MOVING, expected=TrashState.NORMAL)


def _delete_snapshot(driver: DriverProcess, cluster: CephTestCluster, snapshot_id: str) -> None:
    request = csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id, secrets=cluster.secrets)
    until_ok(lambda: driver.controller.DeleteSnapshot(request, timeout=60), deadline=90)


def _delete_volume(driver: DriverProcess, cluster: CephTestCluster, volume_id: str) -> None:
    request = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=cluster.secrets)
    until_ok(lambda: driver.controller.DeleteVolume(request, timeout=60), deadline=90,
             also=(grpc.StatusCode.FAILED_PRECONDITION,))


@pytest.mark.parametrize("child_first", [False, True], ids=["retry-then-child", "child-then-retry"])
def test_snapshot_delete_killed_inside_the_parent_move_is_finished_by_the_retry(
    child_first: bool, fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    healthy = fresh_driver()
    source = healthy.controller.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume.volume_id
    data = pattern("parent-move")
    write(ceph_cluster, source, data)
    snapshot_id = healthy.controller.CreateSnapshot(snapshot_request(ceph_cluster, source), timeout=60).snapshot.snapshot_id
    restored = healthy.controller.CreateVolume(from_snapshot(ceph_cluster, snapshot_id, size=16 * MiB),
                                               timeout=60).volume.volume_id
    image_id = ceph_cluster.omap(f"csi.snap.{snapshot_id[-36:]}")["csi.imageid"]

    doomed = fresh_driver({"CEPHCSI_FAILPOINTS": "snapshot.delete.after-image"})
    with pytest.raises(grpc.RpcError):
        doomed.controller.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot_id,
                                                                       secrets=ceph_cluster.secrets), timeout=60)
    entry = _trash_state(ceph_cluster, image_id)
    assert entry is not None and entry.awaits_children and entry.state is TrashState.NORMAL
    _back_to_moving(ceph_cluster, image_id)
    entry = _trash_state(ceph_cluster, image_id)
    assert entry is not None and entry.state is TrashState.MOVING

    if child_first:
        # The last child leaves while the parent's entry is MOVING: librbd does not purge it.
        _delete_volume(healthy, ceph_cluster, restored)
        assert _trash_state(ceph_cluster, image_id) is not None
        _delete_snapshot(healthy, ceph_cluster, snapshot_id)
    else:
        _delete_snapshot(healthy, ceph_cluster, snapshot_id)
        entry = _trash_state(ceph_cluster, image_id)
        assert entry is not None and entry.state is TrashState.NORMAL and entry.awaits_children
        assert read(ceph_cluster, restored, BLOCK) == data, "the restored volume still reads its snapshot"
        _delete_volume(healthy, ceph_cluster, restored)  # librbd purges the parent with its last child
    assert not ceph_cluster.omap(f"csi.snap.{snapshot_id[-36:]}"), "the snapshot's record is gone"
    _delete_volume(healthy, ceph_cluster, source)
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline


def test_audit_repairs_a_volume_parent_whose_move_was_cut_and_whose_clone_left_meanwhile(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    """The same shape for a volume with a clone, with nobody retrying the delete at first:
    `cephcsi audit` reports the parent, `--repair` finishes the move and purges it (librbd
    never will: its last clone left while the entry was MOVING), and the CO's retry then
    finds nothing left to do but the journal."""
    baseline = read_pool(ceph_cluster)
    healthy = fresh_driver()
    parent = healthy.controller.CreateVolume(create_request(ceph_cluster, size=16 * MiB), timeout=60).volume.volume_id
    clone = healthy.controller.CreateVolume(from_volume(ceph_cluster, parent, size=16 * MiB), timeout=60).volume.volume_id
    image_id = ceph_cluster.omap(f"csi.volume.{parent[-36:]}")["csi.imageid"]
    doomed = fresh_driver({"CEPHCSI_FAILPOINTS": "delete.after-image"})
    with pytest.raises(grpc.RpcError):
        doomed.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=parent, secrets=ceph_cluster.secrets),
                                       timeout=60)
    _back_to_moving(ceph_cluster, image_id)
    _delete_volume(healthy, ceph_cluster, clone)
    entry = _trash_state(ceph_cluster, image_id)
    assert entry is not None and entry.state is TrashState.MOVING, "librbd left the parent behind"

    _, doc, _ = run_audit(ceph_cluster, healthy.config_file)
    found = [f for f in doc["findings"] if f["subject"] == f"trash:{image_id}"]
    assert [(f["kind"], f["fix"]) for f in found] == [("trash-moving", "finish-trash-move-and-purge")], doc["findings"]
    # The killed delete's journal lease must lapse first; until then --repair skips the entry.
    deadline = time.monotonic() + 90
    while True:
        _, doc, _ = run_audit(ceph_cluster, healthy.config_file, "--repair")
        outcomes = [f["repair"] for f in doc["findings"] if f["subject"] == f"trash:{image_id}"]
        if [o["outcome"] for o in outcomes] != ["skipped"] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert [o["outcome"] for o in outcomes] == ["repaired"], outcomes

    _delete_volume(healthy, ceph_cluster, parent)
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline
