"""Encrypted CreateVolume/DeleteVolume with the `vault` KMS on the real Ceph cluster and a real
Vault: the passphrase lands in Vault under ceph-csi's path (not in the image metadata), a retried
CreateVolume keeps it, a clone, a snapshot and its restore get the same passphrase under their
own ids, DeleteVolume and DeleteSnapshot destroy them, and neither the token nor a passphrase reaches the driver's log."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of
from tests.integration.controller.snapshot_helpers import delete_all, from_snapshot, from_volume, snapshot_request
from tests.integration.driver import DriverProcess
from tests.integration.encryption.vault_server import VaultServer

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

POLICY = """
path "secret/data/e2e/*" { capabilities = ["create", "read", "update"] }
path "secret/metadata/e2e/*" { capabilities = ["delete"] }
"""


@pytest.fixture(scope="module")
def vault_token(vault_server: VaultServer) -> str:
    return vault_server.create_token(POLICY, "cephcsi-e2e")


@pytest.fixture(scope="module")
def vault_driver(ceph_cluster: CephTestCluster, vault_server: VaultServer, vault_token: str,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    where = tmp_path_factory.mktemp("vault-kms")
    config = ceph_cluster.write_config(where / "config.json")
    kms = where / "kms.json"
    kms.write_text(json.dumps({"vault-e2e": {
        "encryptionKMSType": "vault", "vaultAddress": vault_server.address, "vaultBackend": "kv-v2",
        "vaultBackendPath": "secret/", "vaultPassphrasePath": "e2e/"}}))
    # ceph-csi's Vault library takes VAULT_TOKEN from the environment before a kubernetes login
    process = DriverProcess(config, mode="controller", args=[f"--kms-config={kms}"],
                            env={"VAULT_TOKEN": vault_token})
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


def image_meta(cluster: CephTestCluster, image: str) -> dict[str, str]:
    out = cluster.admin("rbd", "image-meta", "list", "--format", "json", f"{cluster.pool}/{image}")
    return dict(json.loads(out or "{}"))


def kept(server: VaultServer, volume_id: str) -> str | None:
    status, body = server.api("GET", f"secret/data/e2e/{volume_id}")
    if status == 404:
        return None
    assert status == 200, body
    return str(body["data"]["data"]["data"]["passphrase"])


def test_vault_kms_create_clone_delete(vault_driver: DriverProcess, ceph_cluster: CephTestCluster,
                                       vault_server: VaultServer, vault_token: str) -> None:
    ctl = vault_driver.controller
    request = create_request(ceph_cluster, name="pvc-vault-1", encrypted="true", encryptionKMSID="vault-e2e")
    volume = ctl.CreateVolume(request).volume
    assert volume.volume_context["encryptionKMSID"] == "vault-e2e"
    found = image_meta(ceph_cluster, image_of(volume.volume_id))
    assert found["rbd.csi.ceph.com/encrypted"] == "encryptionPrepared"
    assert "rbd.csi.ceph.com/dek" not in found, "vault keeps the passphrase itself"
    passphrase = kept(vault_server, volume.volume_id)
    assert passphrase is not None and len(passphrase) == 28

    assert ctl.CreateVolume(request).volume.volume_id == volume.volume_id
    assert kept(vault_server, volume.volume_id) == passphrase, "a retry must not replace the key"

    clone_request = from_volume(ceph_cluster, volume.volume_id, name="pvc-vault-clone")
    clone_request.parameters.update(encrypted="true", encryptionKMSID="vault-e2e")
    clone = ctl.CreateVolume(clone_request).volume
    assert kept(vault_server, clone.volume_id) == passphrase

    # A snapshot keeps the passphrase under its own id (restores read it there), and
    # DeleteSnapshot destroys it once the snapshot image is gone, as DeleteVolume does.
    snapshot = ctl.CreateSnapshot(snapshot_request(ceph_cluster, volume.volume_id)).snapshot
    assert kept(vault_server, snapshot.snapshot_id) == passphrase
    restore_request = from_snapshot(ceph_cluster, snapshot.snapshot_id, name="pvc-vault-restore")
    restore_request.parameters.update(encrypted="true", encryptionKMSID="vault-e2e")
    restore = ctl.CreateVolume(restore_request).volume
    assert kept(vault_server, restore.volume_id) == passphrase

    delete_all(vault_driver, ceph_cluster, [snapshot.snapshot_id],
               [restore.volume_id, clone.volume_id, volume.volume_id])
    for volume_id in (volume.volume_id, clone.volume_id, snapshot.snapshot_id, restore.volume_id):
        assert vault_server.api("GET", f"secret/metadata/e2e/{volume_id}")[0] == 404, volume_id
    log = Path(vault_driver.log_path).read_text()
    assert vault_token not in log and passphrase not in log
