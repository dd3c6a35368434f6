"""CreateVolume answers before its journal lease is released (cephcsi.ceph.leases
`Lease.release_behind`): the image id is journaled and the lease released right after. The
failpoint `create.release-behind:pause=N` holds that release back so these tests can look at
the window: the lease is real to other processes, invisible to this process's next call on the
volume (which waits for it), and a kill inside it loses nothing a retry does not restore."""
from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, journal_entries, until_ok, wait_for_empty_trash
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

HELD = "create.release-behind:pause=1.5"  # under the 2 s lease: a wait outlasts it


def _wait_for_id(cluster: CephTestCluster, name: str, timeout: float = 15) -> str:
    give_up = time.monotonic() + timeout
    while not (image_id := journal_entries(cluster, name)[1].get("csi.imageid", "")):
        assert time.monotonic() < give_up, "the image id never reached the journal"
        time.sleep(0.1)
    return image_id


def test_the_answer_comes_before_the_release_and_the_lease_holds_until_it(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": HELD})
    other = fresh_driver()
    warm = creator.controller.CreateVolume(create_request(ceph_cluster), timeout=60).volume  # connected to Ceph
    request = create_request(ceph_cluster)
    started = time.monotonic()
    volume = creator.controller.CreateVolume(request, timeout=60).volume
    assert time.monotonic() - started < 1.4, "CreateVolume waited for its lease release"
    assert not journal_entries(ceph_cluster, request.name)[1].get("csi.imageid"), "the id is journaled after the answer"
    delete = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets)
    # Another process finds the volume's lease held, as during any call on it.
    with pytest.raises(grpc.RpcError) as caught:
        other.controller.DeleteVolume(delete, timeout=60)
    assert caught.value.code() == grpc.StatusCode.ABORTED, caught.value.details()
    image_id = _wait_for_id(ceph_cluster, request.name)
    assert image_id and image_of(volume.volume_id) in ceph_cluster.images()
    other.controller.DeleteVolume(delete, timeout=60)  # released: no lapse to wait out
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    creator.controller.DeleteVolume(
        csi_pb2.DeleteVolumeRequest(volume_id=warm.volume_id, secrets=ceph_cluster.secrets), timeout=60)


def test_the_same_process_waits_for_the_release_instead_of_answering_aborted(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": HELD})
    request = create_request(ceph_cluster)
    volume = creator.controller.CreateVolume(request, timeout=60).volume
    # Back-to-back calls on the new volume, as csi-sanity and a CO's retries make them.
    again = creator.controller.CreateVolume(request, timeout=60).volume
    assert again.volume_id == volume.volume_id
    assert journal_entries(ceph_cluster, request.name)[1].get("csi.imageid"), "the retry came after the release"

    second = create_request(ceph_cluster)
    made = creator.controller.CreateVolume(second, timeout=60).volume
    creator.controller.DeleteVolume(
        csi_pb2.DeleteVolumeRequest(volume_id=made.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    assert journal_entries(ceph_cluster, second.name) == (None, {})
    creator.controller.DeleteVolume(
        csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60)


def test_a_kill_before_the_release_is_repaired_by_the_retry(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    before = set(ceph_cluster.images())
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": HELD})
    request = create_request(ceph_cluster)
    volume = creator.controller.CreateVolume(request, timeout=60).volume
    assert creator.process is not None
    creator.process.kill()
    creator.process.wait(10)
    assert not journal_entries(ceph_cluster, request.name)[1].get("csi.imageid")

    healthy = fresh_driver()
    # ABORTED until the killed creator's lease lapses (2 s), then the same volume.
    again = until_ok(lambda: healthy.controller.CreateVolume(request, timeout=60)).volume
    assert again.volume_id == volume.volume_id
    assert set(ceph_cluster.images()) - before == {image_of(volume.volume_id)}, "exactly one image for one name"
    assert journal_entries(ceph_cluster, request.name)[1].get("csi.imageid"), "the retry journals the id"
    healthy.controller.DeleteVolume(
        csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    assert set(ceph_cluster.images()) == before
    assert journal_entries(ceph_cluster, request.name) == (None, {})
    assert wait_for_empty_trash(ceph_cluster, {image_of(volume.volume_id)}) == []


def test_a_graceful_stop_finishes_the_release(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    creator = fresh_driver({"CEPHCSI_FAILPOINTS": HELD})
    request = create_request(ceph_cluster)
    volume = creator.controller.CreateVolume(request, timeout=60).volume
    assert creator.process is not None
    creator.process.terminate()
    assert creator.process.wait(30) == 0
    assert journal_entries(ceph_cluster, request.name)[1].get("csi.imageid"), "stopped before its release"
    healthy = fresh_driver()
    healthy.controller.DeleteVolume(  # not ABORTED: the lease was released, not left to lapse
        csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60)
    assert journal_entries(ceph_cluster, request.name) == (None, {})
