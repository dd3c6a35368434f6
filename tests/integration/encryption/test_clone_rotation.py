"""A clone of a `vault`-encrypted volume killed after its cut, then a key rotation of the source,
then the retry (issue 33). vault keeps only the source's current passphrase, so the retry cannot
copy the one an earlier attempt's cut opens with: it must cut again under its own rotation lock.

The check is the real one: the source carries a real LUKS2 header (written by cryptsetup into a
file and copied onto the image: no device-mapper needed), the rotation really re-keys that header
(luksAddKey + luksKillSlot, as `cephcsi rotate-key` does) and stores the new passphrase in Vault,
and the clone's header, read back from the clone, must open with the passphrase Vault keeps for
the clone. Without the re-cut the clone would hold the old header and the new passphrase.

The same holds for a `metadata` source whose wrapped passphrase is under ceph-csi's older
`.rbd.csi.ceph.com/dek` key: librbd's clone does not carry `.`-keys, so the copy reads the source's
current one, as for vault."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
import rbd

from cephcsi.ceph.lock_names import rotation_lock_name as lock_name
from cephcsi.encryption.kms import secrets as secrets_kms
from cephcsi.encryption.volume_keys import new_passphrase
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import MiB, image_of, until_ok
from tests.integration.controller.pool_state import admin_ioctx
from tests.integration.controller.snapshot_helpers import delete_all, from_volume, read, snapshot_request, write
from tests.integration.driver import DriverProcess
from tests.integration.encryption.test_controller_keys import KEK, encrypted_request, meta
from tests.integration.encryption.test_rotation_lock import break_dead_controllers_lock, lockers, rotate_lock
from tests.integration.encryption.vault_server import VaultServer

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

HEADER = 1 * MiB
"""What of the image the LUKS2 header below takes (its data segment starts there)."""
POLICY = """
path "secret/data/clonerot/*" { capabilities = ["create", "read", "update"] }
path "secret/metadata/clonerot/*" { capabilities = ["delete"] }
"""


def cryptsetup(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["cryptsetup", *args], input=stdin, text=True, capture_output=True, timeout=60)


def opens(header: Path, passphrase: str) -> bool:
    return cryptsetup("open", "--test-passphrase", "--key-file", "-", str(header), stdin=passphrase).returncode == 0


def kept(server: VaultServer, volume_id: str) -> str | None:
    status, body = server.api("GET", f"secret/data/clonerot/{volume_id}")
    if status == 404:
        return None
    assert status == 200, body
    return str(body["data"]["data"]["data"]["passphrase"])


OLD_DEK = ".rbd.csi.ceph.com/dek"


class Keys:
    """Where the test reads and rotates passphrases: Vault, or (`legacy`) the metadata KMS's
    wrapped key under ceph-csi's older `.`-key of the image."""

    def __init__(self, cluster: CephTestCluster, server: VaultServer | None) -> None:
        self.cluster, self.server = cluster, server

    def kept(self, volume_id: str) -> str | None:
        if self.server is not None:
            return kept(self.server, volume_id)
        found = meta(self.cluster, image_of(volume_id))
        wrapped = found.get("rbd.csi.ceph.com/dek") or found.get(OLD_DEK)
        return secrets_kms.unwrap(KEK, volume_id, wrapped, "t") if wrapped else None

    def store(self, volume_id: str, passphrase: str) -> None:
        if self.server is not None:
            status, body = self.server.api("POST", f"secret/data/clonerot/{volume_id}",
                                           {"data": {"data": {"passphrase": passphrase}}})
            assert status in (200, 204), body
        else:
            self.cluster.admin("rbd", "image-meta", "set", f"{self.cluster.pool}/{image_of(volume_id)}", OLD_DEK,
                               secrets_kms.wrap(KEK, volume_id, passphrase))

    def make_legacy(self, volume_id: str) -> None:
        """The source as an older ceph-csi left it: the wrapped passphrase under the `.`-key only."""
        where = f"{self.cluster.pool}/{image_of(volume_id)}"
        wrapped = meta(self.cluster, image_of(volume_id))["rbd.csi.ceph.com/dek"]
        self.cluster.admin("rbd", "image-meta", "set", where, OLD_DEK, wrapped)
        self.cluster.admin("rbd", "image-meta", "remove", where, "rbd.csi.ceph.com/dek")


def format_source(cluster: CephTestCluster, volume_id: str, passphrase: str, header: Path) -> None:
    """A LUKS2 header opening with `passphrase` on the volume, as a node's first stage writes it."""
    with header.open("wb") as out:
        out.truncate(4 * MiB)
    done = cryptsetup("luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
                      "--luks2-metadata-size", "16k", "--luks2-keyslots-size", "768k", "--key-file", "-", str(header),
                      stdin=passphrase)
    assert done.returncode == 0, done.stderr
    write(cluster, volume_id, header.read_bytes()[:HEADER])


def rotate(cluster: CephTestCluster, keys: Keys, volume_id: str, header: Path) -> str:
    """A key rotation of the source as rotate-key does it, under its rotation lock: a new keyslot
    with a new passphrase, the old slot removed, the header back on the image, and the new
    passphrase in the KMS. The new passphrase."""
    old, new = keys.kept(volume_id), new_passphrase()
    assert old is not None
    rotate_lock(cluster, volume_id, 30)
    keyfile = header.with_suffix(".new")
    keyfile.write_text(new)
    keyfile.chmod(0o600)
    try:
        done = cryptsetup("luksAddKey", "-q", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000",
                          "--key-file", "-", str(header), str(keyfile), stdin=old)
        assert done.returncode == 0, done.stderr
    finally:
        keyfile.unlink()
    done = cryptsetup("luksKillSlot", "-q", "--key-file", "-", str(header), "0", stdin=new)
    assert done.returncode == 0, done.stderr
    assert opens(header, new) and not opens(header, old)
    write(cluster, volume_id, header.read_bytes()[:HEADER])
    keys.store(volume_id, new)
    cluster.admin("rados", "--pool", cluster.pool, "lock", "break", volume_id, lock_name(volume_id),
                  str(lockers(cluster, volume_id)[0]["name"]), "--lock-cookie", "rotate-key test-node")
    return new


def blocklist_watchers(cluster: CephTestCluster, image: str) -> None:
    """What the OSD's watch timeout (30 s) does for a killed controller's watch on the source, at
    once: the retry's write to the source (the temporary snapshot's removal) need not wait for it."""
    status = json.loads(cluster.admin("rbd", "status", "--format", "json", f"{cluster.pool}/{image}"))
    for watcher in status.get("watchers", []):
        cluster.admin("ceph", "osd", "blocklist", "add", str(watcher["address"]))


def image_id(cluster: CephTestCluster, image: str) -> str:
    return str(json.loads(cluster.admin("rbd", "info", "--format", "json", f"{cluster.pool}/{image}"))["id"])


@pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="no cryptsetup (Debian package cryptsetup-bin)")
@pytest.mark.parametrize(("kms_type", "failpoint"), [("vault", "clone.after-clone"),
                                                     ("vault", "clone.after-source-snap"),
                                                     ("legacy-metadata", "clone.after-clone")])
def test_a_clone_killed_after_its_cut_and_retried_after_a_rotation_opens(
        ceph_cluster: CephTestCluster, tmp_path: Path, request: pytest.FixtureRequest, kms_type: str,
        failpoint: str) -> None:
    """Killed after the clone (the retry finds a finished clone with no passphrase of its own:
    removed, cut again) or after the temporary snapshot (the retry must not clone from that older
    snapshot); either way the clone's passphrase opens the clone's own header."""
    config = ceph_cluster.write_config(tmp_path / "config.json")
    kms = tmp_path / "kms.json"
    env: dict[str, str] = {}
    vault_server: VaultServer | None = request.getfixturevalue("vault_server") if kms_type == "vault" else None
    if vault_server is not None:
        env["VAULT_TOKEN"] = vault_server.create_token(POLICY, "cephcsi-clonerot")
        keys = Keys(ceph_cluster, vault_server)
        kms_id = "vault-clonerot"
        kms.write_text(json.dumps({kms_id: {
            "encryptionKMSType": "vault", "vaultAddress": vault_server.address, "vaultBackend": "kv-v2",
            "vaultBackendPath": "secret/", "vaultPassphrasePath": "clonerot/"}}))
    else:
        keys, kms_id = Keys(ceph_cluster, None), "meta"
        kms.write_text(json.dumps({kms_id: {"encryptionKMSType": "metadata"}}))
    args = [f"--kms-config={kms}", "--journal-lock-timeout=2s"]
    tag = f"{kms_type}-{failpoint.split('.')[-1]}"
    retry = DriverProcess(config, mode="controller", args=args, env=env)
    retry.start()
    try:
        ctl = retry.controller
        volume = ctl.CreateVolume(encrypted_request(ceph_cluster, f"pvc-clonerot-src-{tag}", kms_id)).volume
        if kms_type == "legacy-metadata":
            keys.make_legacy(volume.volume_id)
        header = tmp_path / "header.img"
        first = keys.kept(volume.volume_id)
        assert first is not None
        format_source(ceph_cluster, volume.volume_id, first, header)
        clone_request = from_volume(ceph_cluster, volume.volume_id, name=f"pvc-clonerot-{tag}")
        clone_request.parameters.update(encrypted="true", encryptionKMSID=kms_id)
        clone_request.secrets["encryptionPassphrase"] = KEK

        before = set(ceph_cluster.images())
        doomed = DriverProcess(config, mode="controller", args=args, env={**env, "CEPHCSI_FAILPOINTS": failpoint})
        doomed.start()
        try:
            with pytest.raises(grpc.RpcError) as caught:
                doomed.controller.CreateVolume(clone_request)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()  # the kill
            assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
        finally:
            doomed.cleanup()
        clones = sorted(set(ceph_cluster.images()) - before)
        earlier = image_id(ceph_cluster, clones[0]) if clones else None
        assert (earlier is not None) == (failpoint == "clone.after-clone")
        if kms_type == "legacy-metadata":
            # What makes this source like vault: librbd's clone left its `.`-key behind.
            assert not {"rbd.csi.ceph.com/dek", OLD_DEK} & set(meta(ceph_cluster, clones[0]))
        break_dead_controllers_lock(ceph_cluster, volume.volume_id)
        blocklist_watchers(ceph_cluster, image_of(volume.volume_id))
        new = rotate(ceph_cluster, keys, volume.volume_id, header)

        clone = until_ok(lambda: ctl.CreateVolume(clone_request, timeout=60).volume)
        if earlier is not None:
            assert image_id(ceph_cluster, image_of(clone.volume_id)) != earlier, "the untrustworthy cut was kept"
        passphrase = keys.kept(clone.volume_id)
        assert passphrase == new != first
        cloned_header = tmp_path / "clone-header.img"
        with cloned_header.open("wb") as out:
            out.write(read(ceph_cluster, clone.volume_id, HEADER))
            out.truncate(4 * MiB)
        assert opens(cloned_header, passphrase), "the clone's passphrase does not open the clone's LUKS header"
        assert lockers(ceph_cluster, volume.volume_id) == []
        # No temporary snapshot of the killed attempt is left on the source.
        snaps = json.loads(ceph_cluster.admin("rbd", "snap", "ls", "--all", "--format", "json",
                                              f"{ceph_cluster.pool}/{image_of(volume.volume_id)}"))
        assert not [s for s in snaps if str(s["name"]).startswith("cephcsi-tmp-")
                    and s.get("namespace", {}).get("type") == "user"], snaps
        delete_all(retry, ceph_cluster, [], [clone.volume_id, volume.volume_id])
        if vault_server is not None:
            assert kept(vault_server, clone.volume_id) is None
    finally:
        retry.cleanup()


@pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="no cryptsetup (Debian package cryptsetup-bin)")
def test_a_snapshot_of_a_legacy_key_source_killed_after_its_cut_opens(ceph_cluster: CephTestCluster,
                                                                     tmp_path: Path) -> None:
    """The snapshot path with a `.rbd.csi.ceph.com/dek` source (metadata KMS): its cut carries no
    wrapped passphrase, so the retry after a rotation cuts again instead of giving the earlier
    cut the source's new passphrase; the snapshot's passphrase opens the snapshot's header."""
    config = ceph_cluster.write_config(tmp_path / "config.json")
    kms = tmp_path / "kms.json"
    kms.write_text(json.dumps({"meta": {"encryptionKMSType": "metadata"}}))
    args = [f"--kms-config={kms}", "--journal-lock-timeout=2s"]
    keys = Keys(ceph_cluster, None)
    retry = DriverProcess(config, mode="controller", args=args)
    retry.start()
    try:
        volume = retry.controller.CreateVolume(encrypted_request(ceph_cluster, "pvc-snaprot-legacy")).volume
        keys.make_legacy(volume.volume_id)
        header = tmp_path / "header.img"
        first = keys.kept(volume.volume_id)
        assert first is not None
        format_source(ceph_cluster, volume.volume_id, first, header)
        request = snapshot_request(ceph_cluster, volume.volume_id, name="snap-rot-legacy")
        request.secrets["encryptionPassphrase"] = KEK
        before = set(ceph_cluster.images())
        doomed = DriverProcess(config, mode="controller", args=args,
                               env={"CEPHCSI_FAILPOINTS": "snapshot.after-clone"})
        doomed.start()
        try:
            with pytest.raises(grpc.RpcError) as caught:
                doomed.controller.CreateSnapshot(request)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()  # the kill
            assert doomed.process is not None and doomed.process.wait(timeout=30) == -9
        finally:
            doomed.cleanup()
        (cut,) = sorted(set(ceph_cluster.images()) - before)
        assert not {"rbd.csi.ceph.com/dek", OLD_DEK} & set(meta(ceph_cluster, cut))
        earlier = image_id(ceph_cluster, cut)
        break_dead_controllers_lock(ceph_cluster, volume.volume_id)
        blocklist_watchers(ceph_cluster, image_of(volume.volume_id))
        new = rotate(ceph_cluster, keys, volume.volume_id, header)

        snapshot = until_ok(lambda: retry.controller.CreateSnapshot(request, timeout=60).snapshot)
        assert image_id(ceph_cluster, cut) != earlier, "the untrustworthy cut was kept"
        passphrase = secrets_kms.unwrap(KEK, snapshot.snapshot_id, meta(ceph_cluster, cut)["rbd.csi.ceph.com/dek"], "t")
        assert passphrase == new != first
        cut_header = tmp_path / "snapshot-header.img"
        with cut_header.open("wb") as out:
            out.write(read_image(ceph_cluster, cut, HEADER))
            out.truncate(4 * MiB)
        assert opens(cut_header, passphrase), "the snapshot's passphrase does not open the snapshot's LUKS header"
        assert lockers(ceph_cluster, volume.volume_id) == []
        delete_all(retry, ceph_cluster, [snapshot.snapshot_id], [volume.volume_id])
    finally:
        retry.cleanup()


def read_image(cluster: CephTestCluster, image: str, length: int) -> bytes:
    with admin_ioctx(cluster) as io, rbd.Image(io, image, read_only=True) as opened:
        return bytes(opened.read(0, length))
