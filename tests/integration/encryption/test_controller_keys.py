"""Encrypted CreateVolume on the real cluster (issue 33): the passphrase is kept in ceph-csi's
image metadata keys and journal record keys, a retry keeps the same one, a clone and a restore
keep their source's (re-wrapped for their own id), mismatched sources and unknown KMS ids are
INVALID_ARGUMENT, and the driver's log never holds a passphrase."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.encryption.kms import secrets as secrets_kms
from cephcsi.encryption.volume_keys import new_passphrase
from tests.ceph.ceph_csi_journal import journal_as_ceph_csi
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, block_cap, create_request, image_of, journal_entries, until_ok
from tests.integration.controller.snapshot_helpers import delete_all, from_snapshot, from_volume, snapshot_request
from tests.integration.driver import DriverProcess
from tests.integration.encryption.conftest import KmsController
from tests.unit.encryption.test_wrap import go_unwrap, go_wrap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

KEK = "kek-passphrase-for-tests"
DEFAULT_PASS = "default-luks-passphrase"


def meta(cluster: CephTestCluster, image: str) -> dict[str, str]:
    out = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image}")
    return dict(json.loads(out or "{}"))


def encrypted_request(cluster: CephTestCluster, name: str, kms_id: str = "meta") -> csi_pb2.CreateVolumeRequest:
    request = create_request(cluster, name=name, encrypted="true", encryptionKMSID=kms_id)
    request.secrets["encryptionPassphrase"] = KEK
    return request


def test_metadata_kms_volume_clone_restore(kms_driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    ctl = kms_driver.controller
    request = encrypted_request(ceph_cluster, "pvc-enc-1")
    volume = ctl.CreateVolume(request).volume
    assert volume.volume_context["encrypted"] == "true"
    assert volume.volume_context["encryptionKMSID"] == "meta"
    image = image_of(volume.volume_id)
    first = meta(ceph_cluster, image)
    assert first["rbd.csi.ceph.com/encrypted"] == "encryptionPrepared"
    passphrase = secrets_kms.unwrap(KEK, volume.volume_id, first["rbd.csi.ceph.com/dek"], "test")
    assert len(passphrase) == 28
    _, record = journal_entries(ceph_cluster, "pvc-enc-1")
    assert record["csi.volume.encryptKMS"] == "meta" and record["csi.volume.encryptionType"] == "block"

    # A retry keeps the key it made: never a second one.
    assert ctl.CreateVolume(request).volume.volume_id == volume.volume_id
    assert meta(ceph_cluster, image)["rbd.csi.ceph.com/dek"] == first["rbd.csi.ceph.com/dek"]

    # A clone keeps the source's passphrase, re-wrapped for its own id.
    clone_request = from_volume(ceph_cluster, volume.volume_id, name="pvc-enc-clone")
    clone_request.parameters.update(encrypted="true", encryptionKMSID="meta")
    clone_request.secrets["encryptionPassphrase"] = KEK
    clone = ctl.CreateVolume(clone_request).volume
    clone_meta = meta(ceph_cluster, image_of(clone.volume_id))
    assert secrets_kms.unwrap(KEK, clone.volume_id, clone_meta["rbd.csi.ceph.com/dek"], "t") == passphrase

    # So does a restore of a snapshot.
    snap_request = snapshot_request(ceph_cluster, volume.volume_id)
    snap_request.secrets["encryptionPassphrase"] = KEK
    snapshot = ctl.CreateSnapshot(snap_request).snapshot
    # The snapshot image keeps it for its own id, as ceph-csi's copyEncryptionConfig does (so
    # ceph-csi restores it too), and its record names the KMS.
    snap_meta = meta(ceph_cluster, "csi-snap-" + snapshot.snapshot_id[-36:])
    assert secrets_kms.unwrap(KEK, snapshot.snapshot_id, snap_meta["rbd.csi.ceph.com/dek"], "t") == passphrase
    assert ceph_cluster.omap(f"csi.snap.{snapshot.snapshot_id[-36:]}")["csi.volume.encryptKMS"] == "meta"
    restore_request = from_snapshot(ceph_cluster, snapshot.snapshot_id, name="pvc-enc-restore")
    restore_request.parameters.update(encrypted="true", encryptionKMSID="meta")
    restore_request.secrets["encryptionPassphrase"] = KEK
    restored = ctl.CreateVolume(restore_request).volume
    restored_meta = meta(ceph_cluster, image_of(restored.volume_id))
    assert secrets_kms.unwrap(KEK, restored.volume_id, restored_meta["rbd.csi.ceph.com/dek"], "t") == passphrase

    # Encrypted source, unencrypted class: refused as ceph-csi refuses it.
    plain = from_volume(ceph_cluster, volume.volume_id, name="pvc-enc-plain")
    with pytest.raises(grpc.RpcError) as caught:
        ctl.CreateVolume(plain)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unencrypted volume from encrypted" in (caught.value.details() or "")

    delete_all(kms_driver, ceph_cluster, [snapshot.snapshot_id],
               [restored.volume_id, clone.volume_id, volume.volume_id])
    assert journal_entries(ceph_cluster, "pvc-enc-1") == (None, {})
    log = Path(kms_driver.log_path).read_text()
    for secret in (KEK, passphrase):
        assert secret not in log


def test_default_kms_keeps_nothing_per_volume(kms_driver: DriverProcess, ceph_cluster: CephTestCluster) -> None:
    request = create_request(ceph_cluster, name="pvc-enc-default", encrypted="true")
    request.secrets["encryptionPassphrase"] = DEFAULT_PASS
    volume = kms_driver.controller.CreateVolume(request).volume
    found = meta(ceph_cluster, image_of(volume.volume_id))
    assert found.get("rbd.csi.ceph.com/encrypted") == "encryptionPrepared"
    assert "rbd.csi.ceph.com/dek" not in found
    _, record = journal_entries(ceph_cluster, "pvc-enc-default")
    assert record["csi.volume.encryptKMS"] == "default"
    # A Block volume grows on the node when encrypted: its LUKS mapping must follow the image.
    grown = kms_driver.controller.ControllerExpandVolume(csi_pb2.ControllerExpandVolumeRequest(
        volume_id=volume.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
        secrets=ceph_cluster.secrets, volume_capability=block_cap()))
    assert grown.capacity_bytes == 16 * MiB and grown.node_expansion_required
    delete_all(kms_driver, ceph_cluster, [], [volume.volume_id])


@pytest.mark.parametrize("params, fragment", [
    ({"encrypted": "true", "encryptionKMSID": "absent"}, "'absent' is not configured"),
    ({"encrypted": "true", "encryptionKMSID": "odd"}, "type 'kmip', which cephcsi does not support"),
    ({"encrypted": "true", "encryptionType": ""}, "is not one of: block, file"),
    ({"encrypted": "true"}, "encryptionPassphrase"),
])
def test_bad_encryption_is_invalid_argument(kms_driver: DriverProcess, ceph_cluster: CephTestCluster,
                                            params: dict[str, str], fragment: str) -> None:
    request = create_request(ceph_cluster, name="pvc-enc-bad")
    request.parameters.update(params)
    with pytest.raises(grpc.RpcError) as caught:
        kms_driver.controller.CreateVolume(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in (caught.value.details() or "")


@pytest.mark.parametrize("point", ["create.after-image", "create.after-key"])
def test_a_create_killed_around_the_key_is_settled_by_its_retry(ceph_cluster: CephTestCluster,
                                                                kms_controller: Callable[..., KmsController],
                                                                point: str) -> None:
    """Killed after the image but before its passphrase (or after it, before the answer): the
    retry finds the image, gives it a passphrase or keeps the one it has, and answers."""
    config, args = kms_controller()
    name = f"pvc-enc-kill-{point.rsplit('-', 1)[1]}"
    request = encrypted_request(ceph_cluster, name)
    doomed = DriverProcess(config, mode="controller", args=args, env={"CEPHCSI_FAILPOINTS": point})
    doomed.start()
    try:
        with pytest.raises(grpc.RpcError):
            doomed.controller.CreateVolume(request)
        assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
    finally:
        doomed.cleanup()
    _, record = journal_entries(ceph_cluster, name)
    image = record["csi.imagename"]
    before = meta(ceph_cluster, image).get("rbd.csi.ceph.com/dek")
    assert (before is None) == (point == "create.after-image")
    retry = DriverProcess(config, mode="controller", args=args)
    retry.start()
    try:
        volume = until_ok(lambda: retry.controller.CreateVolume(request).volume)
        after = meta(ceph_cluster, image)
        assert after["rbd.csi.ceph.com/encrypted"] == "encryptionPrepared"
        if before is not None:
            assert after["rbd.csi.ceph.com/dek"] == before  # never a second key
        assert secrets_kms.unwrap(KEK, volume.volume_id, after["rbd.csi.ceph.com/dek"], "t")
        delete_all(retry, ceph_cluster, [], [volume.volume_id])
    finally:
        retry.cleanup()


def test_a_clone_keeps_the_state_its_data_was_cut_with(ceph_cluster: CephTestCluster,
                                                       kms_controller: Callable[..., KmsController]) -> None:
    """A clone cut while its source was still blank ("encryptionPrepared"), whose create was
    killed before the key step, while the source was then formatted by a node ("encrypted"):
    the retry keeps the clone "encryptionPrepared" (what librbd copied with its data), so its
    first stage formats it instead of refusing a device without a LUKS header for ever."""
    config, args = kms_controller()
    retry = DriverProcess(config, mode="controller", args=args)
    retry.start()
    try:
        source = retry.controller.CreateVolume(encrypted_request(ceph_cluster, "pvc-enc-state-src")).volume
        clone_request = from_volume(ceph_cluster, source.volume_id, name="pvc-enc-state-clone")
        clone_request.parameters.update(encrypted="true", encryptionKMSID="meta")
        clone_request.secrets["encryptionPassphrase"] = KEK
        doomed = DriverProcess(config, mode="controller", args=args, env={"CEPHCSI_FAILPOINTS": "clone.after-clone"})
        doomed.start()
        try:
            with pytest.raises(grpc.RpcError):
                doomed.controller.CreateVolume(clone_request)
            assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
        finally:
            doomed.cleanup()
        ceph_cluster.admin("rbd", "image-meta", "set", f"{ceph_cluster.pool}/{image_of(source.volume_id)}",
                           "rbd.csi.ceph.com/encrypted", "encrypted")  # what a node's first stage does
        clone = until_ok(lambda: retry.controller.CreateVolume(clone_request).volume)
        assert meta(ceph_cluster, image_of(clone.volume_id))["rbd.csi.ceph.com/encrypted"] == "encryptionPrepared"
        delete_all(retry, ceph_cluster, [], [clone.volume_id, source.volume_id])
    finally:
        retry.cleanup()


@pytest.mark.parametrize("dek_key", ["rbd.csi.ceph.com/dek", ".rbd.csi.ceph.com/dek"], ids=["current", "old-key"])
def test_a_volume_ceph_csi_encrypted_is_cloned_with_its_passphrase(kms_driver: DriverProcess,
                                                                   ceph_cluster: CephTestCluster, dek_key: str) -> None:
    """ceph-csi's layout written by the test (journal by raw RADOS calls, the DEK wrapped by the
    independent construction of tests/unit/encryption/test_wrap.py): cephcsi clones it, the clone
    opens with the same passphrase under its own id, and the ceph-csi volume is deleted."""
    name = f"pvc-ceph-csi-enc-{dek_key[0] == '.'}"
    volume = journal_as_ceph_csi(ceph_cluster, name)
    passphrase = new_passphrase()
    ceph_cluster.admin("rbd", "image-meta", "set", f"{ceph_cluster.pool}/{volume.image}", dek_key,
                       go_wrap(KEK, volume.volume_id, passphrase))
    ceph_cluster.admin("rbd", "image-meta", "set", f"{ceph_cluster.pool}/{volume.image}",
                       "rbd.csi.ceph.com/encrypted", "encrypted")
    for key, value in (("csi.volume.encryptKMS", "meta"), ("csi.volume.encryptionType", "block")):
        ceph_cluster.admin("rados", "-p", ceph_cluster.pool, "setomapval", f"csi.volume.{volume.uuid}", key, value)

    request = from_volume(ceph_cluster, volume.volume_id, name=f"{name}-clone")
    request.parameters.update(encrypted="true", encryptionKMSID="meta")
    request.secrets["encryptionPassphrase"] = KEK
    clone = kms_driver.controller.CreateVolume(request).volume
    found = meta(ceph_cluster, image_of(clone.volume_id))
    assert found["rbd.csi.ceph.com/encrypted"] == "encrypted"
    assert go_unwrap(KEK, clone.volume_id, found["rbd.csi.ceph.com/dek"]) == passphrase
    delete_all(kms_driver, ceph_cluster, [], [clone.volume_id, volume.volume_id])
    assert volume.image not in ceph_cluster.images()


def test_a_retry_asking_for_other_encryption_is_already_exists(kms_driver: DriverProcess,
                                                               ceph_cluster: CephTestCluster) -> None:
    plain = create_request(ceph_cluster, name="pvc-enc-switch")
    volume = kms_driver.controller.CreateVolume(plain).volume
    with pytest.raises(grpc.RpcError) as caught:
        kms_driver.controller.CreateVolume(encrypted_request(ceph_cluster, "pvc-enc-switch"))
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already exists unencrypted" in (caught.value.details() or "")
    assert "rbd.csi.ceph.com/encrypted" not in meta(ceph_cluster, image_of(volume.volume_id))
    delete_all(kms_driver, ceph_cluster, [], [volume.volume_id])
