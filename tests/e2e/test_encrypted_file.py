"""An fscrypt-encrypted claim whose passphrase a real Vault keeps, on the real kubelet node (issue 33).

Set up as docs/encryption.md tells a user: deploy/examples/kms-config.yaml's `vaulttokens` entry
(its vaultAddress the e2e Vault on the node IP) in the ConfigMap deploy/ mounts, the tenant's Vault
token in its namespace's Secret, cephcsi-kms-reader bound there, a class with `encryptionType: file`.
A pod writes; the claim grows; a snapshot restores into a claim a second pod reads; all is deleted.
Asserted: the key is in Vault exactly while its volume or snapshot lives, the image holds encrypted
names and contents only, no token or key in the driver logs or events, nothing left in the pool.
"""
from __future__ import annotations

import json
import logging
import os
import re
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from tests.e2e.checks import DIRECTORY, wait_node_clean
from tests.e2e.env import DEPLOY, IMAGE, E2EEnv, storage_class
from tests.e2e.kube import CONTROLLER_LABELS, DEPLOY_NAMESPACE, NODE_LABELS, image_name, volume_uuid, wait_for
from tests.e2e.snapshot_addon import GROUP, VERSION, start_snapshot_addon
from tests.e2e.test_expansion import MI, df_bytes, grow_ext4
from tests.e2e.test_snapshots import READY_TIMEOUT, content, snapshot
from tests.e2e.test_volumes import IDLE, delete_claim, fs_type, provision
from tests.integration.encryption.vault_server import VaultServer

log = logging.getLogger(__name__)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600, func_only=True)]

if not os.path.exists("/sys/fs/ext4/features/encryption"):
    pytest.skip("this kernel's ext4 has no encryption support", allow_module_level=True)

KMS_EXAMPLE = DEPLOY / "examples" / "kms-config.yaml"
KMS_ID = "vault-tokens-test"
KMS_FILE = "/etc/ceph-csi-encryption-kms-config/config.json"
"""Where deploy/ mounts the KMS ConfigMap in both driver pods."""
FILE_CLASS = "csi-rbd-sc-fscrypt"
TOKEN_SECRET = "ceph-csi-kms-token"
"""The example entry's tenantTokenName: the Secret (key `token`) each tenant namespace brings."""
ENCRYPTED_DIR = "ceph-csi-encrypted"
EXT4_ENCRYPT_FL = 0x800
"""The inode flag of a directory with an fscrypt policy (linux/fs/ext4/ext4.h)."""
TENANT_POLICY = """
path "secret/data/*" { capabilities = ["create", "read", "update"] }
path "secret/metadata/*" { capabilities = ["delete"] }
"""
"""The tenant token's Vault policy: the KV v2 paths of the passphrases, nothing else."""


@dataclass(frozen=True)
class FileClass:
    storage_class: str
    snapshot_class: str


@dataclass(frozen=True)
class Tenant:
    namespace: str
    token: str = field(repr=False)  # never in a failure report


def kept(vault: VaultServer, secret_id: str) -> str | None:
    """The passphrase Vault keeps for a volume or snapshot id (KV v2 at secret/, ceph-csi's
    layout: data.passphrase), read with the root token; None when absent."""
    status, body = vault.api("GET", f"secret/data/{secret_id}")
    if status == 404:
        return None
    assert status == 200, (status, body)
    return str(body["data"]["data"]["data"]["passphrase"])


def destroyed(vault: VaultServer, secret_id: str) -> bool:
    """No version of the secret left (vaultDestroyKeys: the metadata, every version, is deleted)."""
    return vault.api("GET", f"secret/metadata/{secret_id}")[0] == 404


def driver_pods(e2e: E2EEnv) -> list[dict[str, Any]]:
    return [*e2e.kube.ready_pods(NODE_LABELS), *e2e.kube.ready_pods(CONTROLLER_LABELS)]


@pytest.fixture(scope="module")
def file_class(e2e: E2EEnv, e2e_vault: VaultServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileClass]:
    """The example KMS ConfigMap with the Vault's address, the fscrypt StorageClass, the snapshot
    add-on (its example VolumeSnapshotClass: no KMS secret is needed to snapshot a vaulttokens
    volume), and the new ConfigMap seen in every driver pod."""
    kube, ceph = e2e.kube, e2e.ceph
    kms_doc = yaml.safe_load(KMS_EXAMPLE.read_text())
    assert kms_doc["metadata"]["namespace"] == DEPLOY_NAMESPACE
    kms = json.loads(kms_doc["data"]["config.json"])
    assert kms[KMS_ID]["encryptionKMSType"] == "vaulttokens" and kms[KMS_ID]["tenantTokenName"] == TOKEN_SECRET
    kms[KMS_ID]["vaultAddress"] = e2e_vault.address  # the one value a user fills in
    kms_doc["data"]["config.json"] = json.dumps(kms, indent=2)
    kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(kms_doc))
    doc = storage_class(ceph, FILE_CLASS)
    doc["parameters"].update({"encrypted": "true", "encryptionType": "file", "encryptionKMSID": KMS_ID})
    kube.kubectl("apply", "-f", "-", input_text=yaml.safe_dump(doc))
    addon = start_snapshot_addon(e2e, tmp_path_factory.mktemp("snapctl-fscrypt") / "snapshot-controller.log")
    try:
        # The kubelet projects a ConfigMap created after the pods started on its next sync.
        for pod in driver_pods(e2e):
            name = pod["metadata"]["name"]
            wait_for(f"{KMS_FILE} naming the Vault in {name}", lambda: e2e_vault.address in kube.exec_in(
                DEPLOY_NAMESPACE, name, f"cat {KMS_FILE} 2>/dev/null || true"), 120, interval=2.0)
        yield FileClass(FILE_CLASS, addon.class_name)
    finally:
        try:
            addon.stop()
        finally:
            kube.kubectl("delete", "--ignore-not-found", "storageclass", FILE_CLASS)
            # A claim a failed test left is deleted at e2e's uninstall, which needs the KMS entry.
            if not [pv for pv in kube.pvs() if pv["spec"].get("storageClassName") == FILE_CLASS]:
                kube.kubectl("-n", DEPLOY_NAMESPACE, "delete", "--ignore-not-found", "configmap",
                             kms_doc["metadata"]["name"])


@pytest.fixture
def tenant(e2e: E2EEnv, e2e_vault: VaultServer) -> Iterator[Tenant]:
    """A claim namespace as a vaulttokens tenant: cephcsi-kms-reader bound for both driver service
    accounts (deploy/node-rbac.yaml's command) and the Secret with a Vault token limited to the
    passphrases' paths. Whatever the test leaves is deleted while the token and Vault still exist
    (DeleteVolume needs both to destroy the key)."""
    kube = e2e.kube
    namespace = e2e.new_namespace()
    kube.kubectl("-n", namespace, "create", "rolebinding", "cephcsi-kms-reader", "--clusterrole=cephcsi-kms-reader",
                 f"--serviceaccount={DEPLOY_NAMESPACE}:cephcsi-node",
                 f"--serviceaccount={DEPLOY_NAMESPACE}:cephcsi-controller")
    token = e2e_vault.create_token(TENANT_POLICY, f"tenant-{namespace}")
    kube.core.create_namespaced_secret(namespace, {  # through the API: the token in no argv
        "metadata": {"name": TOKEN_SECRET}, "stringData": {"token": token}})
    try:
        yield Tenant(namespace, token)
    finally:
        release(e2e, namespace)
        kube.delete_namespace(namespace)


def release(e2e: E2EEnv, namespace: str) -> None:
    """Delete the namespace's pods, snapshots and claims and wait for their PVs to go."""
    kube = e2e.kube
    custom = kubernetes.client.CustomObjectsApi(kube.api)
    try:
        for pod in kube.pods(namespace):
            kube.delete_pod(namespace, pod["metadata"]["name"])
        for item in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots")["items"]:
            custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots",
                                                   item["metadata"]["name"])
        volumes = [claim["spec"].get("volumeName") for claim in kube.pvcs(namespace)]
        for claim in kube.pvcs(namespace):
            kube.delete_pvc(namespace, claim["metadata"]["name"])
        for name in filter(None, volumes):
            kube.wait_pv_gone(name, timeout=120)
    except Exception as error:  # noqa: BLE001 - the test's own failure says more; e2e's uninstall retries
        log.warning("releasing %s: %s", namespace, error)


def debugfs(image_file: Path, request: str) -> bytes:
    """debugfs reads the ext4 of an image copy without mounting it (so no key is involved)."""
    return subprocess.run(["debugfs", "-R", request, str(image_file)], capture_output=True, timeout=60,
                          check=True).stdout


def entries(image_file: Path, directory: str) -> list[bytes]:
    """The names in an ext4 directory of the image, read from its blocks (found by debugfs) as
    the kernel wrote them: without the key an encrypted name is raw ciphertext of any bytes, NULs
    and newlines included, which no listing tool prints faithfully. Linear directory blocks of
    ext4_dir_entry_2 records (inode u32, rec_len u16, name_len u8, file_type u8, name)."""
    size = re.search(rb"Block size:\s+(\d+)", debugfs(image_file, "stats"))
    assert size is not None
    block_size = int(size.group(1))
    names = []
    with open(image_file, "rb") as image:
        for number in debugfs(image_file, f"blocks {directory}").split():
            image.seek(int(number) * block_size)
            block, offset = image.read(block_size), 0
            while offset + 8 <= block_size:
                inode, rec_len, name_len = struct.unpack_from("<IHB", block, offset)
                if inode and block[offset + 8:offset + 8 + name_len] not in (b".", b".."):
                    names.append(block[offset + 8:offset + 8 + name_len])
                offset += rec_len or block_size
    return names


def check_ciphertext(e2e: E2EEnv, image: str, plain_names: list[str], token: str) -> None:
    """The unstaged image, copied out of Ceph: the encrypted directory has an fscrypt policy and
    as many entries as the pod made, each named by ciphertext (none of their names; padded to 32
    bytes, the policy's padding); neither the names nor the token appear anywhere in its bytes;
    google/fscrypt's metadata sits beside it."""
    with tempfile.TemporaryDirectory(prefix="cephcsi-fscrypt-e2e-") as work:
        copy = Path(work) / "image"
        e2e.ceph.admin("rbd", "export", "--no-progress", f"{e2e.ceph.pool}/{image}", str(copy), timeout=120)
        root = entries(copy, "/")
        assert ENCRYPTED_DIR.encode() in root and b".fscrypt" in root, root
        assert sorted(entries(copy, "/.fscrypt")) == [b"policies", b"protectors"]
        flags = re.search(rb"Flags: (0x[0-9a-f]+)", debugfs(copy, f"stat /{ENCRYPTED_DIR}"))
        assert flags is not None and int(flags.group(1), 16) & EXT4_ENCRYPT_FL, flags
        names = entries(copy, f"/{ENCRYPTED_DIR}")
        assert len(names) == len(plain_names), (names, plain_names)
        assert all(len(name) == 32 for name in names), names
        assert not {name.encode() for name in plain_names} & set(names), names
        data = copy.read_bytes()
    assert token.encode() not in data, "the pod's token is in the image in plain text"
    leaked = [name for name in plain_names if len(name) > 8 and name.encode() in data]
    assert not leaked, f"file names in the image in plain text: {leaked}"


def check_no_secret_leaked(e2e: E2EEnv, volume_id: str, secrets: dict[str, str]) -> None:
    """No driver log (current and, after a restart, previous container) and no event of any
    namespace holds a secret; the logs checked are the ones that served the volume."""
    kube = e2e.kube
    texts: dict[str, str] = {}
    for pod in [*kube.pods(DEPLOY_NAMESPACE, NODE_LABELS), *kube.pods(DEPLOY_NAMESPACE, CONTROLLER_LABELS)]:
        name = pod["metadata"]["name"]
        texts[name] = kube.logs(name)
        if any(s.get("restartCount") for s in pod["status"].get("containerStatuses") or []):
            texts[f"{name} (previous)"] = kube.logs(name, previous=True)
    assert any(volume_id in text for text in texts.values()), "no driver log names the volume"
    events = json.loads(kube.core.list_event_for_all_namespaces(_preload_content=False).data)["items"]
    texts["events"] = "\n".join(f"{e.get('reason')} {e.get('message')} {e.get('note')}" for e in events)
    for what, secret in secrets.items():
        leaked = [where for where, text in texts.items() if secret in text]
        assert not leaked, f"{what} is in {leaked}"


@dataclass
class Traces:
    """What names a volume or snapshot in the pool: its uuid (image name, journal record,
    directory value, rotation-lock object) and its image id (rbd_header/rbd_data/object map)."""

    uuids: list[str] = field(default_factory=list)
    image_ids: list[str] = field(default_factory=list)

    def add(self, e2e: E2EEnv, uuid_: str, image: str) -> None:
        info = json.loads(e2e.ceph.admin("rbd", "info", "-p", e2e.ceph.pool, image, "--format", "json"))
        self.uuids.append(uuid_)
        self.image_ids.append(str(info["id"]))

    def left(self, e2e: E2EEnv) -> list[str]:
        ids = re.compile(r"\.(" + "|".join(map(re.escape, self.image_ids)) + r")(\.|$)")
        objects = [o for o in e2e.ceph.objects() if any(u in o for u in self.uuids) or ids.search(o)]
        keys = [f"{directory}:{key}" for directory in (DIRECTORY, "csi.snaps.default")
                for key, value in e2e.ceph.omap(directory).items() if value in self.uuids]
        trash = [entry["name"] for entry in e2e.ceph.trash() if any(u in entry["name"] for u in self.uuids)]
        return objects + keys + trash


def test_fscrypt_claim_with_its_key_in_vault(e2e: E2EEnv, e2e_vault: VaultServer, file_class: FileClass,
                                             tenant: Tenant) -> None:
    started = time.monotonic()
    kube, namespace = e2e.kube, tenant.namespace
    custom = kubernetes.client.CustomObjectsApi(kube.api)
    token = uuid.uuid4().hex
    diary = f"diary-{uuid.uuid4().hex[:12]}"
    pv = provision(e2e, namespace, "data", file_class.storage_class)
    volume_id, image = pv["spec"]["csi"]["volumeHandle"], image_name(pv)
    traces = Traces()
    traces.add(e2e, volume_uuid(pv), image)
    passphrase = kept(e2e_vault, volume_id)
    assert passphrase is not None and len(passphrase) == 28, "CreateVolume keeps the passphrase in Vault"
    meta = json.loads(e2e.ceph.admin("rbd", "image-meta", "list", "--format", "json", f"{e2e.ceph.pool}/{image}"))
    assert meta.get("rbd.csi.ceph.com/encrypted") == "encryptionPrepared" and "rbd.csi.ceph.com/dek" not in meta, meta

    write = (f"if [ ! -f /data/blob.sum ]; then echo {token} > /data/{diary} && head -c 4194304 /dev/urandom > "
             f"/data/blob && sha256sum /data/blob > /data/blob.sum && sync; fi; {IDLE}")
    kube.create_pod(namespace, "app", IMAGE, write, "data")
    kube.wait_pod_ready(namespace, "app")
    kube.wait_written(namespace, "app", "/data/blob.sum")
    assert kube.exec_in(namespace, "app", f"cat /data/{diary}").strip() == token
    assert fs_type(e2e, namespace, "app") == "ext4"
    # Publish binds the encrypted directory, not the filesystem's root (.fscrypt, lost+found).
    assert sorted(kube.exec_in(namespace, "app", "ls -A /data").split()) == sorted(["blob", "blob.sum", diary])
    before = df_bytes(e2e, namespace, "app")

    # On a node without online ext4 growth the next stage grows it, and unlocks the directory again.
    grow_ext4(e2e, namespace, "data", pv, 160, pod="app", command=write)
    assert df_bytes(e2e, namespace, "app") >= before + 80 * MI
    assert kube.exec_in(namespace, "app", f"cat /data/{diary}").strip() == token
    kube.exec_in(namespace, "app", "sha256sum -c /data/blob.sum && echo grown > /data/after-growth && sync")

    # A snapshot while the pod runs: it keeps the passphrase in Vault under its own id.
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "VolumeSnapshot", "metadata": {"name": "snap"},
        "spec": {"volumeSnapshotClassName": file_class.snapshot_class,
                 "source": {"persistentVolumeClaimName": "data"}}})
    wait_for("VolumeSnapshot readyToUse",
             lambda: (snapshot(custom, namespace, "snap").get("status") or {}).get("readyToUse") is True,
             READY_TIMEOUT, interval=1.0,
             explain=lambda: f"{snapshot(custom, namespace, 'snap').get('status')}\n{kube.events(namespace, 'snap')}")
    content_name = snapshot(custom, namespace, "snap")["status"]["boundVolumeSnapshotContentName"]
    snapshot_id = content(custom, content_name)["status"]["snapshotHandle"]
    assert kept(e2e_vault, snapshot_id) == passphrase
    traces.add(e2e, snapshot_id[-36:], f"csi-snap-{snapshot_id[-36:]}")

    kube.delete_pod(namespace, "app")
    wait_node_clean(pv, image)  # unstaged: the key left the kernel, the image is all there is
    check_ciphertext(e2e, image, ["blob", "blob.sum", diary, "after-growth"], token)

    kube.core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": "restored"},
        "spec": {"storageClassName": file_class.storage_class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "160Mi"}},
                 "dataSource": {"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": "snap"}}})
    restored = kube.wait_bound(namespace, "restored", timeout=120)
    restored_id = restored["spec"]["csi"]["volumeHandle"]
    traces.add(e2e, volume_uuid(restored), image_name(restored))
    # The restore holds the source's fscrypt protector, which only the source's passphrase opens.
    assert kept(e2e_vault, restored_id) == passphrase
    kube.create_pod(namespace, "reader", IMAGE, IDLE, "restored")
    kube.wait_pod_ready(namespace, "reader")
    assert kube.exec_in(namespace, "reader", f"cat /data/{diary}").strip() == token
    kube.exec_in(namespace, "reader", "sha256sum -c /data/blob.sum && test -s /data/after-growth")
    kube.delete_pod(namespace, "reader")
    wait_node_clean(restored, image_name(restored))

    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "volumesnapshots", "snap")
    wait_for("VolumeSnapshot and its content deleted",
             lambda: not snapshot(custom, namespace, "snap") and not content(custom, content_name), timeout=120)
    wait_for("the snapshot's key destroyed in Vault", lambda: destroyed(e2e_vault, snapshot_id), timeout=30)
    assert kept(e2e_vault, volume_id) == passphrase, "the source's key outlives its snapshot"
    delete_claim(e2e, namespace, "restored", restored)
    assert destroyed(e2e_vault, restored_id)
    assert kept(e2e_vault, volume_id) == passphrase, "the source's key outlives its restore"
    delete_claim(e2e, namespace, "data", pv)
    assert destroyed(e2e_vault, volume_id)

    check_no_secret_leaked(e2e, volume_id, {"the tenant's Vault token": tenant.token,
                                            "Vault's root token": e2e_vault.root_token,
                                            "the volume's passphrase": passphrase})
    wait_for("nothing of the volumes and the snapshot left in the pool", lambda: not traces.left(e2e),
             timeout=90, explain=lambda: repr(traces.left(e2e)))
    log.info("fscrypt claim with its key in Vault: %.0fs", time.monotonic() - started)
