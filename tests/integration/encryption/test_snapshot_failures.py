"""A CreateSnapshot of an encrypted volume that fails for good (the call lacks the passphrase
its KMS needs) leaves no clone of the source behind: nothing that no DeleteSnapshot would ever
name, and nothing that keeps the source in the trash after its delete."""
from __future__ import annotations

import grpc
import pytest

from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.pool_state import read_pool, trashed_images, wait_for_pool
from tests.integration.controller.snapshot_helpers import snapshot_request
from tests.integration.driver import DriverProcess
from tests.integration.encryption.test_controller_keys import KEK, encrypted_request

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def test_a_snapshot_refused_for_its_key_leaves_no_clone(kms_driver: DriverProcess,
                                                        ceph_cluster: CephTestCluster) -> None:
    baseline = read_pool(ceph_cluster)
    ctl = kms_driver.controller
    volume = ctl.CreateVolume(encrypted_request(ceph_cluster, "pvc-snapfail-1")).volume
    request = snapshot_request(ceph_cluster, volume.volume_id, name="snap-snapfail-1")  # no encryptionPassphrase
    with pytest.raises(grpc.RpcError) as caught:
        ctl.CreateSnapshot(request, timeout=60)
    assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    images = ceph_cluster.admin("rbd", "ls", ceph_cluster.pool).split()
    assert not [name for name in images if name.startswith("csi-snap-")], "the failed snapshot left its clone"
    # Nothing of it is left for the retry either: with the passphrase it cuts afresh.
    request.secrets["encryptionPassphrase"] = KEK
    snapshot = ctl.CreateSnapshot(request, timeout=60).snapshot
    assert snapshot.ready_to_use
    ctl.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snapshot.snapshot_id, secrets=ceph_cluster.secrets),
                       timeout=60)
    ctl.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets),
                     timeout=60)
    assert wait_for_pool(ceph_cluster, baseline, timeout=120) == baseline, trashed_images(ceph_cluster)
