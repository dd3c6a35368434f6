"""KMS access in both modes (issue 33): the node reads the tenant from the journal record
(`rados getomapval`, key in a 0600 file) and hands it to the KMS, only for non-default KMS ids;
the Kubernetes reader connects on the first read a KMS asks for and never before; the node
wiring honours --kms-config. Commands are faked (FakeRunner); the real ones run in
tests/integration/encryption/test_node_kms_access.py."""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.cli import kms_secrets
from cephcsi.cli.kms_secrets import KubeSecretReader, LazyKubeReader
from cephcsi.encryption.kms import secrets as secrets_kms
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.encryption.volume_keys import DEK_KEY, VolumeKeys
from cephcsi.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from cephcsi.node import journal_owner
from cephcsi.node.journal_owner import JournalOwner
from cephcsi.node.luks_keys import KmsKeys
from cephcsi.node.service import NodeConfig
from cephcsi.node.stage_record import ImageSpec
from cephcsi.volumes import journal
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOLUME = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"
KEY = "AQDNxw5nAAAAABAAm5iF0VdkmIsjJm9H4BXRBQ=="
KEK = "tenant-kek"
VOLUME_PASSPHRASE = "volume-passphrase-28-chars-x="


def test_the_node_reads_the_same_record_keys_the_controller_writes() -> None:
    assert journal_owner.OWNER_KEY == journal.OWNER
    assert journal_owner.RECORD_PREFIX == journal.VOLUMES.record_prefix
    assert journal_owner.record_object(VOLUME) == "csi.volume.11111111-2222-3333-4444-555555555555"
    assert journal_owner.record_object("pvc-static-volume") is None


def test_a_static_volume_has_no_record_and_no_owner() -> None:
    runner = FakeRunner()
    assert owner_reader(runner).read("csi-vol-static") == "" and runner.calls == []


def owner_reader(runner: FakeRunner, namespace: str = "") -> JournalOwner:
    return JournalOwner(runner, 5.0, ImageSpec("rbd", "csi-vol-1", namespace), "127.0.0.1:6789", Credentials("csi", KEY))


def test_owner_is_read_with_a_key_file_never_the_key_in_argv() -> None:
    runner = FakeRunner(lambda argv: (0, "tenant-a\n", "Writing to -\n"))
    assert owner_reader(runner, "ns1").read(VOLUME) == "tenant-a"
    (call,) = runner.calls
    assert call.argv[:5] == ["rados", "--pool", "rbd", "--namespace", "ns1"]
    assert call.argv[-4:] == ["getomapval", "csi.volume.11111111-2222-3333-4444-555555555555", "csi.volume.owner", "-"]
    assert not any(KEY in arg for arg in call.argv) and call.secrets == (KEY,)
    (keyfile,) = [arg.split("=", 1)[1] for arg in call.argv if arg.startswith("--keyfile=")]
    assert call.files[keyfile] == (0o600, KEY) and not os.path.exists(keyfile)


@pytest.mark.parametrize("answer", [
    (1, "No such key: rbd/csi.volume.x/csi.volume.owner\n", ""),
    (1, "", "error getting omap value rbd/csi.volume.x/csi.volume.owner: (2) No such file or directory\n"),
], ids=["no-owner-key", "no-record"])
def test_a_record_without_owner_is_no_tenant(answer: tuple[int, str, str]) -> None:
    assert owner_reader(FakeRunner(lambda argv: answer)).read(VOLUME) == ""


def test_a_refused_read_is_permission_denied_naming_the_record() -> None:
    runner = FakeRunner(lambda argv: (1, "", "error getting omap value: (1) Operation not permitted\n"))
    with pytest.raises(PermissionDenied, match="csi.volume.11111111"):
        owner_reader(runner).read(VOLUME)


class DictSecrets:
    def __init__(self, secrets: Mapping[tuple[str, str], Mapping[str, str]]) -> None:
        self.secrets = secrets
        self.reads: list[tuple[str, str]] = []

    def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        self.reads.append((namespace, name))
        return self.secrets.get((namespace, name))


def kms_file(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"tenant-meta": {"encryptionKMSType": "metadata", "secretName": "luks-kek"}}))
    return str(path)


def test_node_unwraps_with_the_secret_in_the_owners_namespace(tmp_path: Path) -> None:
    reader = DictSecrets({("tenant-a", "luks-kek"): {"encryptionPassphrase": KEK}})
    keys = KmsKeys(VolumeKeys(kms_file(tmp_path), secret_reader=reader, namespace="ceph-csi-rbd"))
    metadata = {DEK_KEY: secrets_kms.wrap(KEK, VOLUME, VOLUME_PASSPHRASE)}
    spec = EncryptionSpec(type="block", kms_id="tenant-meta")
    asked: list[str] = []

    def tenant() -> str:
        asked.append("owner")
        return "tenant-a"

    assert keys.passphrase(metadata, VOLUME, spec, {}, tenant=tenant) == VOLUME_PASSPHRASE
    assert asked == ["owner"] and reader.reads == [("tenant-a", "luks-kek")]
    # Without an owner (no tenant), a Secret relative to the tenant cannot be found: said so.
    with pytest.raises(InvalidArgument, match="claim's namespace"):
        keys.passphrase(metadata, VOLUME, spec, {}, tenant=lambda: "")


def test_the_default_kms_never_reads_the_owner(tmp_path: Path) -> None:
    keys = KmsKeys(VolumeKeys(kms_file(tmp_path)))

    def tenant() -> str:
        raise AssertionError("the default KMS read the journal record")

    spec = EncryptionSpec(type="block", kms_id="default")
    assert keys.passphrase({}, VOLUME, spec, {"encryptionPassphrase": "class-pass"}, tenant=tenant) == "class-pass"


class FakeApi:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        if self.error is not None:
            raise self.error
        return {"token": f"{namespace}/{name}"}

    def read_config_map(self, namespace: str, name: str) -> dict[str, str]:
        if self.error is not None:
            raise self.error
        return {"vaultAddress": f"https://{namespace}.{name}"}


def test_lazy_reader_connects_once_on_the_first_read_only() -> None:
    connects: list[str] = []

    def connector(kubeconfig: str) -> FakeApi:
        connects.append(kubeconfig)
        return FakeApi()

    reader = LazyKubeReader("/etc/kubeconfig", connector=connector)  # type: ignore[arg-type]
    assert not reader.connected and connects == []
    threads = [threading.Thread(target=reader.read_secret, args=("t", "s")) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reader.read_config_map("t", "c") == {"vaultAddress": "https://t.c"}
    assert connects == ["/etc/kubeconfig"] and reader.connected


def test_lazy_reader_retries_a_failed_connect() -> None:
    attempts: list[int] = []

    def connector(kubeconfig: str) -> FakeApi:
        attempts.append(1)
        if len(attempts) == 1:
            raise FailedPrecondition("no token yet")
        return FakeApi()

    reader = LazyKubeReader(connector=connector)  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition):
        reader.read_secret("t", "s")
    assert reader.read_secret("t", "s") == {"token": "t/s"} and len(attempts) == 2


def test_reader_maps_missing_to_none_and_forbidden_to_the_binding_to_make() -> None:
    assert KubeSecretReader(FakeApi(NotFound("gone"))).read_config_map("t", "c") is None  # type: ignore[arg-type]
    assert KubeSecretReader(FakeApi(NotFound("gone"))).read_secret("t", "s") is None  # type: ignore[arg-type]
    with pytest.raises(PermissionDenied, match="kubectl -n tenant-b create rolebinding cephcsi-kms-reader"):
        KubeSecretReader(FakeApi(PermissionDenied("forbidden"))).read_secret("tenant-b", "s")  # type: ignore[arg-type]


def test_connect_without_any_client_config_is_failed_precondition(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(FailedPrecondition, match="needs the Kubernetes API"):
        kms_secrets.connect("")
    with pytest.raises(FailedPrecondition, match="--kubeconfig"):
        kms_secrets.connect(str(tmp_path / "missing-kubeconfig"))


def test_node_wiring_honours_kms_config_and_connects_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cephcsi.cli.node_wiring import node_keys

    monkeypatch.setenv("POD_NAMESPACE", "ceph-csi-rbd")
    config = NodeConfig(node_id="n1", driver_name="rbd.csi.ceph.com", kubelet_dir=str(tmp_path), state_dir=str(tmp_path),
                        mounter="", domain_labels=(), max_volumes_per_node=0, device_timeout=1, command_timeout=1,
                        connect_timeout=1, kubeconfig="/nowhere/kubeconfig", kms_config=kms_file(tmp_path))
    keys = node_keys(config)
    assert keys.keys.kms_config_path == config.kms_config and keys.keys.namespace == "ceph-csi-rbd"
    reader = keys.keys.secret_reader
    assert isinstance(reader, LazyKubeReader) and reader.kubeconfig == "/nowhere/kubeconfig"
    assert not reader.connected
    # Only a KMS that reads a Secret connects; here the kubeconfig does not exist, which it says.
    with pytest.raises(FailedPrecondition, match="/nowhere/kubeconfig"):
        keys.passphrase({}, VOLUME, EncryptionSpec(type="block", kms_id="tenant-meta"), {}, tenant=lambda: "tenant-a")
