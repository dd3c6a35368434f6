"""The volume's cluster lock (cephcsi.node.volume_lock) on the real Ceph cluster: one holder at a
time across cookies (a first LUKS format on one node, a stage or a key rotation elsewhere), a
waiter that gets it once the holder releases, release never breaking another's lock, and the
rotation refused while a format holds it; `rados lock info` as the tool answers it: no lockers
for a lock never taken, an error (never "no lockers") when the read itself is refused."""
from __future__ import annotations

import threading
import time
import uuid

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import CephCSIError, OperationInFlight
from cephcsi.node import exec as node_exec
from cephcsi.node.key_rotation import RotationLock
from cephcsi.node.stage_record import ImageSpec
from cephcsi.node.volume_lock import ClusterLock
from tests.ceph.fixtures import CephTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def test_one_holder_at_a_time_and_a_waiter_gets_it_after_release(ceph_cluster: CephTestCluster) -> None:
    volume_id = f"0001-0004-test-0000000000000001-{uuid.uuid4()}"
    image = ImageSpec(ceph_cluster.pool, f"csi-vol-{uuid.uuid4()}")
    credentials = Credentials(ceph_cluster.user, ceph_cluster.key)

    def lock(cookie: str) -> ClusterLock:
        return ClusterLock(node_exec.run, 30, image, ceph_cluster.mon_host, credentials, volume_id, cookie,
                           f"test {cookie}", duration=120)

    first, second = lock("cephcsi-format@node-a/1"), lock("cephcsi-format@node-b/2")
    assert first.take()
    try:
        assert not second.take()
        assert not second.wait(2.0, interval=0.5)  # bounded: gives up while the holder keeps it
        second.release()  # not its lock: nothing is broken
        assert [locker["cookie"] for locker in first.lockers()] == [first.cookie]
        with pytest.raises(OperationInFlight, match="holds its lock"):
            with RotationLock(node_exec.run, 30, image, ceph_cluster.mon_host, credentials, volume_id,
                              "node-c").held():
                pass
        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(second.wait(60.0, interval=0.5)))
        waiter.start()
        time.sleep(2.0)
        assert not got  # still waiting while the first holds it
        first.release()
        waiter.join(90)
        assert got == [True]
        assert [locker["cookie"] for locker in second.lockers()] == [second.cookie]
    finally:
        first.release()
        second.release()
    assert first.lockers() == []


def test_a_lock_never_taken_has_no_lockers_and_a_refused_read_raises(ceph_cluster: CephTestCluster) -> None:
    volume_id = f"0001-0004-test-0000000000000001-{uuid.uuid4()}"
    image = ImageSpec(ceph_cluster.pool, f"csi-vol-{uuid.uuid4()}")
    never = ClusterLock(node_exec.run, 30, image, ceph_cluster.mon_host, Credentials(ceph_cluster.user, ceph_cluster.key),
                        volume_id, "cephcsi-format@node-a/1", "test", duration=120)
    assert never.lockers() == []  # its object does not exist
    never.release()  # nothing to release: no error
    # A read that fails for another reason (here a pool that is gone, also ENOENT): before, this
    # read as "no lockers" and release() did nothing.
    gone = ClusterLock(node_exec.run, 30, ImageSpec(f"gone-{uuid.uuid4().hex[:8]}", image.image), ceph_cluster.mon_host,
                       Credentials(ceph_cluster.user, ceph_cluster.key), volume_id, "cephcsi-format@node-a/1", "test")
    with pytest.raises(CephCSIError, match=f"read the lock of volume {volume_id}"):
        gone.lockers()
    with pytest.raises(CephCSIError):
        gone.release()
