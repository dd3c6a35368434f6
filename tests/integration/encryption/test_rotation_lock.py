"""CreateSnapshot of an encrypted volume against a running key rotation (issue 33): the controller
holds the volume's rotation lock (ceph-csi's `<volume id>-mutexlock` cls_lock, which
`cephcsi rotate-key` takes with the `rados` tool) from the cut to the key copy. A rotation's lock
is waited for (bounded), then the call answers ABORTED; a controller killed while holding the lock
leaves one with a duration, which lapses."""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph.rotation_lock import WAIT_SECONDS, lock_name
from cephcsi.encryption.kms import secrets as secrets_kms
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import image_of, until_ok
from tests.integration.controller.snapshot_helpers import delete_all, from_volume, snapshot_request
from tests.integration.driver import DriverProcess
from tests.integration.encryption.test_controller_keys import KEK, encrypted_request, meta

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


@pytest.fixture(scope="module")
def driver(ceph_cluster: CephTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    where = tmp_path_factory.mktemp("rotlock")
    config = ceph_cluster.write_config(where / "config.json")
    kms = where / "kms.json"
    kms.write_text(json.dumps({"meta": {"encryptionKMSType": "metadata"}}))
    process = DriverProcess(config, mode="controller", args=[f"--kms-config={kms}"])
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


def rotate_lock(cluster: CephTestCluster, volume_id: str, seconds: int) -> None:
    """Take the lock as `cephcsi rotate-key` does (cephcsi.node.volume_lock.ClusterLock.take)."""
    cluster.admin("rados", "--pool", cluster.pool, "lock", "get", volume_id, lock_name(volume_id),
                  "--lock-type", "exclusive", "--lock-cookie", "rotate-key test-node",
                  "--lock-duration", str(seconds), "--lock-description", "key rotation")


def lockers(cluster: CephTestCluster, volume_id: str) -> list[dict[str, object]]:
    out = cluster.admin("rados", "--pool", cluster.pool, "lock", "info", volume_id, lock_name(volume_id),
                        "--format", "json")
    return list(json.loads(out).get("lockers", []))


def snap_request(cluster: CephTestCluster, volume_id: str, name: str) -> csi_pb2.CreateSnapshotRequest:
    request = snapshot_request(cluster, volume_id, name=name)
    request.secrets["encryptionPassphrase"] = KEK
    return request


def test_a_snapshot_waits_for_a_rotation_then_gives_up_with_aborted(driver: DriverProcess,
                                                                   ceph_cluster: CephTestCluster) -> None:
    ctl = driver.controller
    volume = ctl.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotlock-1")).volume

    # A rotation holding the lock longer than the controller waits: ABORTED, after the wait.
    rotate_lock(ceph_cluster, volume.volume_id, 60)
    request = snap_request(ceph_cluster, volume.volume_id, "snap-rotlock-busy")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        ctl.CreateSnapshot(request, timeout=60)
    waited = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert f"key rotation of volume {volume.volume_id} in progress; retry" in (caught.value.details() or "")
    assert waited >= WAIT_SECONDS - 1
    # Nothing was cut while the rotation held the lock.
    images = ceph_cluster.admin("rbd", "ls", ceph_cluster.pool).split()
    assert not [name for name in images if name.startswith("csi-snap-")]
    # The rotation's lock is untouched by the refused call.
    assert [str(locker["cookie"]) for locker in lockers(ceph_cluster, volume.volume_id)] == ["rotate-key test-node"]

    # A rotation that ends (its lock lapses, as a killed rotate-key's does) within the wait: the
    # retry waits for it and cuts, and releases its own lock after the key copy.
    ceph_cluster.admin("rados", "--pool", ceph_cluster.pool, "lock", "break", volume.volume_id,
                       lock_name(volume.volume_id), str(lockers(ceph_cluster, volume.volume_id)[0]["name"]),
                       "--lock-cookie", "rotate-key test-node")
    rotate_lock(ceph_cluster, volume.volume_id, 4)
    started = time.monotonic()
    snapshot = ctl.CreateSnapshot(request, timeout=60).snapshot
    assert time.monotonic() - started >= 2  # it did wait for the rotation's lock
    assert snapshot.ready_to_use
    dek = meta(ceph_cluster, "csi-snap-" + snapshot.snapshot_id[-36:])["rbd.csi.ceph.com/dek"]
    source_dek = meta(ceph_cluster, image_of(volume.volume_id))["rbd.csi.ceph.com/dek"]
    assert secrets_kms.unwrap(KEK, snapshot.snapshot_id, dek, "t") == \
        secrets_kms.unwrap(KEK, volume.volume_id, source_dek, "t")
    assert lockers(ceph_cluster, volume.volume_id) == []
    delete_all(driver, ceph_cluster, [snapshot.snapshot_id], [volume.volume_id])


def test_a_controller_killed_holding_the_lock_leaves_one_that_lapses(ceph_cluster: CephTestCluster,
                                                                     tmp_path: Path) -> None:
    config = ceph_cluster.write_config(tmp_path / "config.json")
    kms = tmp_path / "kms.json"
    kms.write_text(json.dumps({"meta": {"encryptionKMSType": "metadata"}}))
    args = [f"--kms-config={kms}", "--journal-lock-timeout=2s"]
    plain = DriverProcess(config, mode="controller", args=args)
    plain.start()
    try:
        volume = plain.controller.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotlock-kill")).volume
    finally:
        plain.cleanup()
    request = snap_request(ceph_cluster, volume.volume_id, "snap-rotlock-kill")
    doomed = DriverProcess(config, mode="controller", args=args, env={"CEPHCSI_FAILPOINTS": "snapshot.after-clone"})
    doomed.start()
    try:
        with pytest.raises(grpc.RpcError):
            doomed.controller.CreateSnapshot(request)
        assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
    finally:
        doomed.cleanup()
    # The killed controller's lock is there, named as the controller's, with an expiry: it lapses.
    left = lockers(ceph_cluster, volume.volume_id)
    assert len(left) == 1 and str(left[0]["cookie"]).startswith("cephcsi-controller ")
    assert str(left[0]["expiration"]) not in ("", "0.000000", "0.000000s")
    # Breaking the dead holder's lock (what its lapse does) lets the retry finish the snapshot.
    ceph_cluster.admin("rados", "--pool", ceph_cluster.pool, "lock", "break", volume.volume_id,
                       lock_name(volume.volume_id), str(left[0]["name"]), "--lock-cookie", str(left[0]["cookie"]))
    retry = DriverProcess(config, mode="controller", args=args)
    retry.start()
    try:
        snapshot = until_ok(lambda: retry.controller.CreateSnapshot(request, timeout=60).snapshot)
        assert snapshot.ready_to_use
        assert lockers(ceph_cluster, volume.volume_id) == []
        delete_all(retry, ceph_cluster, [snapshot.snapshot_id], [volume.volume_id])
    finally:
        retry.cleanup()


def test_a_clone_of_an_encrypted_volume_waits_for_a_rotation(driver: DriverProcess,
                                                             ceph_cluster: CephTestCluster) -> None:
    """Clone to key copy under the source's rotation lock too: ABORTED while a rotation holds it,
    done once it lapses."""
    ctl = driver.controller
    volume = ctl.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotlock-src")).volume
    request = from_volume(ceph_cluster, volume.volume_id, name="pvc-rotlock-clone")
    request.parameters.update(encrypted="true", encryptionKMSID="meta")
    request.secrets["encryptionPassphrase"] = KEK
    rotate_lock(ceph_cluster, volume.volume_id, 60)
    with pytest.raises(grpc.RpcError) as caught:
        ctl.CreateVolume(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert f"key rotation of volume {volume.volume_id} in progress" in (caught.value.details() or "")
    ceph_cluster.admin("rados", "--pool", ceph_cluster.pool, "lock", "break", volume.volume_id,
                       lock_name(volume.volume_id), str(lockers(ceph_cluster, volume.volume_id)[0]["name"]),
                       "--lock-cookie", "rotate-key test-node")
    rotate_lock(ceph_cluster, volume.volume_id, 4)
    clone = ctl.CreateVolume(request, timeout=60).volume
    clone_dek = meta(ceph_cluster, image_of(clone.volume_id))["rbd.csi.ceph.com/dek"]
    source_dek = meta(ceph_cluster, image_of(volume.volume_id))["rbd.csi.ceph.com/dek"]
    assert secrets_kms.unwrap(KEK, clone.volume_id, clone_dek, "t") == \
        secrets_kms.unwrap(KEK, volume.volume_id, source_dek, "t")
    assert lockers(ceph_cluster, volume.volume_id) == []
    delete_all(driver, ceph_cluster, [], [clone.volume_id, volume.volume_id])
