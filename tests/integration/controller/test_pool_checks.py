"""The tests' own pool check (`pool_state.wait_for_pool`) against the one residue it forgives:
a deleted image whose queued purge a Ceph client that is no driver holds up with its watch."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import rados
import rbd

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, wait_for_empty_trash
from tests.integration.controller.pool_state import TrashedImage, read_pool, trashed_images, wait_for_pool
from tests.integration.driver import DriverProcess, driver_client_ids

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]


def test_a_purge_held_by_a_foreign_watch_is_forgiven_and_drains_after_it(
    fresh_driver: Callable[..., DriverProcess], ceph_cluster: CephTestCluster
) -> None:
    baseline = read_pool(ceph_cluster)
    # The delete pauses between the move to the trash and queueing the purge: a foreign
    # client opens the trashed image read-write (a watch) in that second.
    driver = fresh_driver({"CEPHCSI_FAILPOINTS": "delete.after-trash:pause=3"})
    volume = driver.controller.CreateVolume(create_request(ceph_cluster), timeout=60).volume
    name = image_of(volume.volume_id)
    request = csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets)
    deleting = threading.Thread(target=lambda: driver.controller.DeleteVolume(request, timeout=60))
    deleting.start()
    foreign = rados.Rados(rados_id="admin", conf={"mon_host": ceph_cluster.mon_host, "key": ceph_cluster.admin_key})
    foreign.connect()
    try:
        deadline = time.monotonic() + 10
        trashed: list[TrashedImage] = []
        while not trashed and time.monotonic() < deadline:
            trashed = [t for t in trashed_images(ceph_cluster) if t.name == name]
            time.sleep(0.05)
        assert trashed, "the delete did not move the image to the trash"
        with foreign.open_ioctx(ceph_cluster.pool) as io, rbd.Image(io, image_id=trashed[0].image_id):
            deleting.join(30)
            assert not deleting.is_alive()
            watcher = int(foreign.get_instance_id())
            assert watcher not in driver_client_ids() and driver_client_ids()
            # Forgiven: the image is in the trash, its purge queued, only a foreign watch on it.
            assert wait_for_pool(ceph_cluster, baseline, timeout=5) == baseline
            assert wait_for_empty_trash(ceph_cluster, {name}, timeout=1) == []
            assert [t.watchers for t in trashed_images(ceph_cluster) if t.name == name] == [frozenset({watcher})]
    finally:
        foreign.shutdown()
    # The mgr's retry (30 s after its first attempt) purges it once the watch is gone.
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline
    assert not [t for t in trashed_images(ceph_cluster) if t.name == name]
