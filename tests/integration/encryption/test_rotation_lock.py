"""CreateSnapshot of an encrypted volume against a running key rotation (issue 33): the controller
holds the volume's rotation lock (ceph-csi's `<volume id>-mutexlock` cls_lock, which
`cephcsi rotate-key` takes with the `rados` tool) from the cut to the key copy. A rotation's lock
is waited for (bounded), then the call answers ABORTED; a controller killed while holding the lock
leaves one with a duration, which lapses."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import rados

from cephcsi._generated import csi_pb2
from cephcsi.ceph import rotation_lock
from cephcsi.ceph.lock_names import rotation_lock_name as lock_name
from cephcsi.ceph.rotation_lock import WAIT_SECONDS
from cephcsi.encryption.kms import secrets as secrets_kms
from cephcsi.encryption.volume_keys import new_passphrase
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import image_of, until_ok
from tests.integration.controller.snapshot_helpers import delete_all, from_volume, snapshot_request
from tests.integration.driver import DriverProcess
from tests.integration.encryption.conftest import KmsController
from tests.integration.encryption.test_controller_keys import KEK, encrypted_request, meta
from tests.integration.encryption.vault_server import VaultServer

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def rotate_lock(cluster: CephTestCluster, volume_id: str, seconds: int) -> None:
    """Take the lock as `cephcsi rotate-key` does (cephcsi.node.volume_lock.ClusterLock.take)."""
    cluster.admin("rados", "--pool", cluster.pool, "lock", "get", volume_id, lock_name(volume_id),
                  "--lock-type", "exclusive", "--lock-cookie", "rotate-key test-node",
                  "--lock-duration", str(seconds), "--lock-description", "key rotation")


def lockers(cluster: CephTestCluster, volume_id: str) -> list[dict[str, object]]:
    out = cluster.admin("rados", "--pool", cluster.pool, "lock", "info", volume_id, lock_name(volume_id),
                        "--format", "json")
    return list(json.loads(out).get("lockers", []))


def objects(cluster: CephTestCluster) -> list[str]:
    return cluster.admin("rados", "--pool", cluster.pool, "ls").split()


def snap_request(cluster: CephTestCluster, volume_id: str, name: str) -> csi_pb2.CreateSnapshotRequest:
    request = snapshot_request(cluster, volume_id, name=name)
    request.secrets["encryptionPassphrase"] = KEK
    return request


def test_a_snapshot_waits_for_a_rotation_then_gives_up_with_aborted(kms_driver: DriverProcess,
                                                                   ceph_cluster: CephTestCluster) -> None:
    ctl = kms_driver.controller
    volume = ctl.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotlock-1")).volume

    # A rotation holding the lock longer than the controller waits: ABORTED, after the wait.
    rotate_lock(ceph_cluster, volume.volume_id, 60)
    request = snap_request(ceph_cluster, volume.volume_id, "snap-rotlock-busy")
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        ctl.CreateSnapshot(request, timeout=60)
    waited = time.monotonic() - started
    assert caught.value.code() == grpc.StatusCode.ABORTED
    # The refusal quotes the holder's own description of itself.
    assert f"volume {volume.volume_id}'s rotation lock is held by 'key rotation'; retry" in (caught.value.details() or "")
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
    delete_all(kms_driver, ceph_cluster, [snapshot.snapshot_id], [volume.volume_id])
    # DeleteVolume took the lock's empty object with the volume.
    assert volume.volume_id not in objects(ceph_cluster)


def test_a_controller_killed_holding_the_lock_leaves_one_that_lapses(
        ceph_cluster: CephTestCluster, kms_controller: Callable[..., KmsController]) -> None:
    config, args = kms_controller()
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
    # Its description names the holder and the operation (a refused rotate-key shows it).
    said = str(left[0]["description"])
    assert said.startswith("cephcsi controller snapshot ") and f" of {volume.volume_id} on " in said, said
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


def test_a_clone_of_an_encrypted_volume_waits_for_a_rotation(kms_driver: DriverProcess,
                                                             ceph_cluster: CephTestCluster) -> None:
    """Clone to key copy under the source's rotation lock too: ABORTED while a rotation holds it,
    done once it lapses."""
    ctl = kms_driver.controller
    volume = ctl.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotlock-src")).volume
    request = from_volume(ceph_cluster, volume.volume_id, name="pvc-rotlock-clone")
    request.parameters.update(encrypted="true", encryptionKMSID="meta")
    request.secrets["encryptionPassphrase"] = KEK
    rotate_lock(ceph_cluster, volume.volume_id, 60)
    with pytest.raises(grpc.RpcError) as caught:
        ctl.CreateVolume(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.ABORTED
    assert f"volume {volume.volume_id}'s rotation lock is held by 'key rotation'" in (caught.value.details() or "")
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
    delete_all(kms_driver, ceph_cluster, [], [clone.volume_id, volume.volume_id])


def rotate_in_metadata(cluster: CephTestCluster, volume_id: str) -> tuple[str, str]:
    """A key rotation's Ceph side for the `metadata` KMS as `cephcsi rotate-key` writes it
    (cephcsi.node.key_rotation.KmsKeyStore.replace: the new passphrase wrapped for the volume's id
    into its image metadata); the LUKS header part needs a device and is left out. Taken under the
    rotation lock, as rotate-key does. (old passphrase, new passphrase)."""
    image = image_of(volume_id)
    old = secrets_kms.unwrap(KEK, volume_id, meta(cluster, image)["rbd.csi.ceph.com/dek"], "t")
    new = new_passphrase()
    rotate_lock(cluster, volume_id, 30)
    cluster.admin("rbd", "image-meta", "set", f"{cluster.pool}/{image}", "rbd.csi.ceph.com/dek",
                  secrets_kms.wrap(KEK, volume_id, new))
    cluster.admin("rados", "--pool", cluster.pool, "lock", "break", volume_id, lock_name(volume_id),
                  str(lockers(cluster, volume_id)[0]["name"]), "--lock-cookie", "rotate-key test-node")
    return old, new


def kill_at(cluster: CephTestCluster, config: str, args: list[str], failpoint: str,
            call: Callable[[DriverProcess], object]) -> None:
    doomed = DriverProcess(config, mode="controller", args=args, env={"CEPHCSI_FAILPOINTS": failpoint})
    doomed.start()
    try:
        with pytest.raises(grpc.RpcError) as caught:
            call(doomed)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()  # the kill
        assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
    finally:
        doomed.cleanup()


def break_dead_controllers_lock(cluster: CephTestCluster, volume_id: str) -> None:
    """What the killed controller's lock's lapse does (30 s), at once."""
    left = lockers(cluster, volume_id)
    assert len(left) == 1 and str(left[0]["cookie"]).startswith("cephcsi-controller ")
    cluster.admin("rados", "--pool", cluster.pool, "lock", "break", volume_id, lock_name(volume_id),
                  str(left[0]["name"]), "--lock-cookie", str(left[0]["cookie"]))


@pytest.mark.parametrize("copy", ["snapshot", "clone"])
def test_a_rotation_after_a_killed_cut_does_not_reach_the_copy(ceph_cluster: CephTestCluster,
                                                               kms_controller: Callable[..., KmsController],
                                                               copy: str) -> None:
    """A controller killed between the cut and the key copy, its lock lapsed, then the source's
    key rotated (metadata KMS): the retry gives the copy the passphrase its header was cut with
    (the wrapped one librbd carried into the copy), not the source's new one, with which the
    copy's LUKS header would never open."""
    config, args = kms_controller()
    retry = DriverProcess(config, mode="controller", args=args)
    retry.start()
    try:
        volume = retry.controller.CreateVolume(encrypted_request(ceph_cluster, f"pvc-rotcut-src-{copy}")).volume
        if copy == "snapshot":
            request = snap_request(ceph_cluster, volume.volume_id, "snap-rotcut")
            kill_at(ceph_cluster, config, args, "snapshot.after-clone", lambda d: d.controller.CreateSnapshot(request))
        else:
            clone_request = from_volume(ceph_cluster, volume.volume_id, name="pvc-rotcut-clone")
            clone_request.parameters.update(encrypted="true", encryptionKMSID="meta")
            clone_request.secrets["encryptionPassphrase"] = KEK
            kill_at(ceph_cluster, config, args, "clone.after-clone", lambda d: d.controller.CreateVolume(clone_request))
        break_dead_controllers_lock(ceph_cluster, volume.volume_id)
        old, new = rotate_in_metadata(ceph_cluster, volume.volume_id)
        if copy == "snapshot":
            copy_id = until_ok(lambda: retry.controller.CreateSnapshot(request, timeout=60).snapshot).snapshot_id
            image = "csi-snap-" + copy_id[-36:]
        else:
            copy_id = until_ok(lambda: retry.controller.CreateVolume(clone_request, timeout=60).volume).volume_id
            image = image_of(copy_id)
        assert secrets_kms.unwrap(KEK, copy_id, meta(ceph_cluster, image)["rbd.csi.ceph.com/dek"], "t") == old != new
        assert lockers(ceph_cluster, volume.volume_id) == []
        if copy == "snapshot":
            delete_all(retry, ceph_cluster, [copy_id], [volume.volume_id])
        else:
            delete_all(retry, ceph_cluster, [], [copy_id, volume.volume_id])
    finally:
        retry.cleanup()


@pytest.fixture
def admin_io(ceph_cluster: CephTestCluster) -> Iterator[rados.Ioctx]:
    client = rados.Rados(rados_id="admin", conf={"mon_host": ceph_cluster.mon_host, "key": ceph_cluster.admin_key})
    client.connect()
    try:
        with client.open_ioctx(ceph_cluster.pool) as io:
            yield io
    finally:
        client.shutdown()


def lapse(cluster: CephTestCluster, volume_id: str, timeout: float = 30) -> None:
    """Wait until the OSD counts the lock lapsed (its lockers list drops expired ones): seconds
    after its expiry on a busy shared machine."""
    deadline = time.monotonic() + timeout
    while lockers(cluster, volume_id):
        assert time.monotonic() < deadline, f"the lock of {volume_id} did not lapse in {timeout} s"
        time.sleep(1)


def test_confirm_fails_once_the_lock_lapsed_even_if_nobody_took_it(admin_io: rados.Ioctx,
                                                                   ceph_cluster: CephTestCluster) -> None:
    """The slow-copy case: a controller whose cut and key read outlast the lock's duration must not
    copy the key. MUST_RENEW refuses a lapsed lock (plain RENEW would quietly take it afresh), also
    when no rotation took it in the gap; a lock held throughout is confirmed and extended."""
    volume_id = "0001-000c-test-cluster-0000000000000001-00000000-0000-4000-8000-00000000c0f1"
    with rotation_lock.held(admin_io, volume_id, "test", hold_seconds=4) as held:
        held.confirm()  # held throughout: extended by 4 s from now
        time.sleep(1)
        held.confirm()  # still within the extension
        assert str(lockers(ceph_cluster, volume_id)[0]["description"]) == rotation_lock.description("test")
        lapse(ceph_cluster, volume_id)
        with pytest.raises(rotation_lock.LockLapsed):
            held.confirm()
        assert lockers(ceph_cluster, volume_id) == []  # and the failed renewal did not take it again
    with rotation_lock.held(admin_io, volume_id, "test", hold_seconds=1) as held:
        lapse(ceph_cluster, volume_id)
        rotate_lock(ceph_cluster, volume_id, 30)  # a rotation takes the lapsed lock
        with pytest.raises(rotation_lock.LockLapsed):
            held.confirm()
    assert [str(locker["cookie"]) for locker in lockers(ceph_cluster, volume_id)] == ["rotate-key test-node"]
    ceph_cluster.admin("rados", "--pool", ceph_cluster.pool, "rm", volume_id)


def test_a_vault_snapshot_killed_after_its_cut_is_cut_again(ceph_cluster: CephTestCluster,
                                                           kms_controller: Callable[..., KmsController],
                                                           vault_server: VaultServer) -> None:
    """vault keeps only a volume's current passphrase, so a retry cannot know which one an earlier
    attempt's cut (killed, its lock lapsed, a rotation since) opens with: it removes that cut and
    cuts again under its own lock, and gives the new cut the source's passphrase now."""
    token = vault_server.create_token(VAULT_POLICY, "cephcsi-rotcut")
    config, args = kms_controller({"vault-rot": {
        "encryptionKMSType": "vault", "vaultAddress": vault_server.address, "vaultBackend": "kv-v2",
        "vaultBackendPath": "secret/", "vaultPassphrasePath": "rotcut/"}})
    env = {"VAULT_TOKEN": token}
    retry = DriverProcess(config, mode="controller", args=args, env=env)
    retry.start()
    try:
        volume = retry.controller.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotcut-vault", "vault-rot")).volume
        request = snapshot_request(ceph_cluster, volume.volume_id, name="snap-rotcut-vault")
        doomed = DriverProcess(config, mode="controller", args=args,
                               env={**env, "CEPHCSI_FAILPOINTS": "snapshot.after-clone"})
        doomed.start()
        try:
            with pytest.raises(grpc.RpcError) as caught:
                doomed.controller.CreateSnapshot(request)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
            assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
        finally:
            doomed.cleanup()
        first_cut = [name for name in ceph_cluster.images() if name.startswith("csi-snap-")]
        assert len(first_cut) == 1
        first_id = json.loads(ceph_cluster.admin("rbd", "info", "--format", "json",
                                                 f"{ceph_cluster.pool}/{first_cut[0]}"))["id"]
        break_dead_controllers_lock(ceph_cluster, volume.volume_id)
        # The rotation's KMS side (its header side needs a device): a new passphrase for the source.
        old = vault_kept(vault_server, volume.volume_id)
        new = new_passphrase()
        status, body = vault_server.api("POST", f"secret/data/rotcut/{volume.volume_id}",
                                        {"data": {"data": {"passphrase": new}}})
        assert status in (200, 204), body
        snapshot = until_ok(lambda: retry.controller.CreateSnapshot(request, timeout=60).snapshot)
        again = json.loads(ceph_cluster.admin("rbd", "info", "--format", "json",
                                              f"{ceph_cluster.pool}/{first_cut[0]}"))["id"]
        assert again != first_id, "the untrustworthy cut was kept"
        assert vault_kept(vault_server, snapshot.snapshot_id) == new != old
        delete_all(retry, ceph_cluster, [snapshot.snapshot_id], [volume.volume_id])
    finally:
        retry.cleanup()


VAULT_POLICY = """
path "secret/data/rotcut/*" { capabilities = ["create", "read", "update"] }
path "secret/metadata/rotcut/*" { capabilities = ["delete"] }
"""


def vault_kept(server: VaultServer, volume_id: str) -> str | None:
    status, body = server.api("GET", f"secret/data/rotcut/{volume_id}")
    if status == 404:
        return None
    assert status == 200, body
    return str(body["data"]["data"]["data"]["passphrase"])


def test_delete_leaves_a_held_rotation_lock_object(kms_driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    """A rotation holding the lock of a volume being deleted keeps the object (and its lock): the
    delete never pulls it from under a holder."""
    volume = kms_driver.controller.CreateVolume(encrypted_request(ceph_cluster, "pvc-rotlock-held-delete")).volume
    rotate_lock(ceph_cluster, volume.volume_id, 60)
    delete_all(kms_driver, ceph_cluster, [], [volume.volume_id])
    assert volume.volume_id in objects(ceph_cluster)
    assert [str(locker["cookie"]) for locker in lockers(ceph_cluster, volume.volume_id)] == ["rotate-key test-node"]
    ceph_cluster.admin("rados", "--pool", ceph_cluster.pool, "rm", volume.volume_id)
