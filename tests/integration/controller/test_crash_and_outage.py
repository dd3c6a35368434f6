"""Crash consistency (SIGKILL at every step boundary of create and delete) and Ceph outages."""
from __future__ import annotations

import json
import time
from collections.abc import Callable

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.volumes.volume_id import VolumeId
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, journal_entries, until_ok, wait_for_empty_trash
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

CREATE_POINTS = ["create.after-reserve", "create.after-record", "create.after-image"]
DELETE_POINTS = ["delete.after-trash", "delete.after-image", "delete.after-release"]


def _dies(call: Callable[[], object]) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()


def _dies_once_free(call: Callable[[], object], deadline: float = 30.0) -> None:
    give_up = time.monotonic() + deadline
    while True:
        try:
            call()
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.ABORTED and time.monotonic() < give_up:
                time.sleep(0.2)
                continue
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
            return
        raise AssertionError("the call returned instead of dying at its failpoint")


@pytest.mark.parametrize("point", CREATE_POINTS)
def test_create_killed_at_each_step_is_completed_by_the_retry(
    point: str, fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    request = create_request(ceph_cluster)
    before = set(ceph_cluster.images())
    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": point})
    _dies(lambda: crashing.controller.CreateVolume(request, timeout=60))
    assert crashing.process is not None and crashing.process.wait(10) == -9

    healthy = fresh_driver()
    volume = until_ok(lambda: healthy.controller.CreateVolume(request, timeout=60)).volume
    again = healthy.controller.CreateVolume(request, timeout=60).volume
    assert again.volume_id == volume.volume_id
    new_images = set(ceph_cluster.images()) - before
    assert new_images == {image_of(volume.volume_id)}, "exactly one image for one name"
    uuid_value, record = journal_entries(ceph_cluster, request.name)
    assert volume.volume_id.endswith(uuid_value or "?")
    assert record["csi.imagename"] == image_of(volume.volume_id) and record["csi.imageid"]

    healthy.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets))
    assert set(ceph_cluster.images()) == before
    assert journal_entries(ceph_cluster, request.name) == (None, {})


@pytest.mark.parametrize("point", DELETE_POINTS)
def test_delete_killed_at_each_step_is_finished_by_the_retry(
    point: str, fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    healthy = fresh_driver()
    request = create_request(ceph_cluster)
    volume = healthy.controller.CreateVolume(request, timeout=60).volume
    uuid_value, _ = journal_entries(ceph_cluster, request.name)
    delete = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets)

    crashing = fresh_driver({"CEPHCSI_FAILPOINTS": point})
    _dies(lambda: crashing.controller.DeleteVolume(delete, timeout=60))

    until_ok(lambda: healthy.controller.DeleteVolume(delete, timeout=60))
    healthy.controller.DeleteVolume(delete, timeout=60)
    assert image_of(volume.volume_id) not in ceph_cluster.images()
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    assert f"csi.volume.{uuid_value}" not in ceph_cluster.objects()
    assert wait_for_empty_trash(ceph_cluster, {image_of(volume.volume_id)}) == [], "a trashed image was leaked"


def test_claim_deleted_after_a_create_died_unjournaled_and_a_delete_died_after_the_trash_move(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    """The worst chain for a leak: the create dies with its image made but its id never
    journaled, the claim is deleted, and the clean-up's DeleteVolume dies right after moving
    the image to the trash (where only its id can find it). The retry must still purge it."""
    request = create_request(ceph_cluster)
    before = set(ceph_cluster.images())
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": "create.after-image"})
    _dies(lambda: creator.controller.CreateVolume(request, timeout=60))
    uuid_value, record = journal_entries(ceph_cluster, request.name)
    assert uuid_value and not record.get("csi.imageid"), "the image id must not be journaled yet"
    image = f"csi-vol-{uuid_value}"
    assert image in ceph_cluster.images()

    healthy = fresh_driver()
    # The id the provisioner's find() hands to DeleteVolume for such a claim.
    pools = json.loads(ceph_cluster.admin("ceph", "osd", "pool", "ls", "detail", "-f", "json"))
    pool_id = next(int(p["pool_id"]) for p in pools if p["pool_name"] == ceph_cluster.pool)
    volume_id = VolumeId(ceph_cluster.cluster_id, pool_id, uuid_value).encode()
    delete = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=ceph_cluster.secrets)
    deleter = fresh_driver({"CEPHCSI_FAILPOINTS": "delete.after-trash"})
    # ABORTED until the killed creator's journal lease lapses (2 s), then killed at the point.
    _dies_once_free(lambda: deleter.controller.DeleteVolume(delete, timeout=60))
    assert image not in ceph_cluster.images(), "the killed delete had moved the image to the trash"
    # The killed delete had journaled the id before the move: the record still finds the image.
    assert journal_entries(ceph_cluster, request.name)[1].get("csi.imageid")

    until_ok(lambda: healthy.controller.DeleteVolume(delete, timeout=60), deadline=90,
             also=(grpc.StatusCode.FAILED_PRECONDITION,))
    assert set(ceph_cluster.images()) == before
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    assert f"csi.volume.{uuid_value}" not in ceph_cluster.objects()
    assert wait_for_empty_trash(ceph_cluster, {image}, timeout=150) == [], "a trashed image was leaked"


def test_unresponsive_cluster_gives_bounded_errors_then_recovers(
    driver: DriverProcess, ceph_cluster: CephTestCluster
) -> None:
    """The module's driver runs with 5 s op timeouts. Freeze every daemon: calls must fail with
    DEADLINE_EXCEEDED/UNAVAILABLE well before the client's own deadline; after the thaw the
    same driver (same cached connection) serves again without a restart."""
    warm = driver.controller.CreateVolume(create_request(ceph_cluster), timeout=30).volume
    request = create_request(ceph_cluster)
    ceph_cluster.freeze()
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            driver.controller.CreateVolume(request, timeout=120)
        elapsed = time.monotonic() - started
        assert caught.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE), caught.value.details()
        assert elapsed < 30, f"a Ceph call hung for {elapsed:.0f}s despite op timeouts"
        assert "Ceph" in (caught.value.details() or "")
    finally:
        ceph_cluster.thaw()
    deadline = time.monotonic() + 60
    while True:
        try:
            volume = driver.controller.CreateVolume(request, timeout=30).volume
            break
        except grpc.RpcError as error:
            assert error.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)
            assert time.monotonic() < deadline, "the driver did not recover after the cluster came back"
            time.sleep(1)
    assert ceph_cluster.images().count(image_of(volume.volume_id)) == 1
    for vid in (volume.volume_id, warm.volume_id):
        driver.controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vid, secrets=ceph_cluster.secrets), timeout=60)


def test_sigterm_stops_gracefully_and_removes_the_socket(fresh_driver: Callable[..., DriverProcess]) -> None:
    process = fresh_driver()
    assert process.stop() == 0
    import os

    assert not os.path.exists(process.socket)
