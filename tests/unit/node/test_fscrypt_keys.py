"""Which secret opens a file-encrypted volume's protector (cephcsi.node.fscrypt.stage), and the
fscrypt record codec's proto3 rules. The kernel side and google/fscrypt interop are in
tests/integration/node/test_fscrypt_layout.py."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption.kms.base import Kms
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.encryption.volume_keys import VolumeKeys
from cephcsi.errors import FailedPrecondition
from cephcsi.node.fscrypt import keys, stage as fscrypt_stage, volume, wire
from cephcsi.node.journal_owner import JournalOwner
from cephcsi.node.luks_keys import KmsKeys
from cephcsi.node.requests import StageRequest, VolumeAccess
from cephcsi.node.stage_record import ImageSpec, StageRecord

pytestmark = pytest.mark.unit

VOLUME = "0001-0004-ceph-0000000000000001-5f0c4c2a-2f6e-11ee-9e0b-0242ac110002"


class KeptKms(Kms):
    """A KMS that keeps passphrases itself (like vault), in a dict."""
    kms_type = "kept"

    def __init__(self, kept: dict[str, str]) -> None:
        super().__init__("kept")
        self.kept = kept

    @property
    def dek_in_image(self) -> bool:
        return False

    def store(self, volume_id: str, passphrase: str) -> None:
        self.kept[volume_id] = passphrase

    def fetch(self, volume_id: str) -> str | None:
        return self.kept.get(volume_id)


class KeptKeys(VolumeKeys):
    def __init__(self, kept: dict[str, str]) -> None:
        super().__init__()
        self.kept = kept

    def kms(self, spec: EncryptionSpec, secrets: Mapping[str, str], tenant: str = "") -> Kms:
        return KeptKms(self.kept)


def files(volume_keys: VolumeKeys) -> fscrypt_stage.FileStage:
    source = KmsKeys(volume_keys)
    return fscrypt_stage.FileStage(lambda: source, lambda request: None)  # type: ignore[arg-type,return-value]


def record(tmp_path: os.PathLike[str]) -> StageRecord:
    return StageRecord(volume_id=VOLUME, staging_path=str(tmp_path), cluster_id="ceph", pool="rbd", image="img",
                       namespace="", mapper="fuse", access_type="mount", fs_type="ext4", encryption="file")


def request(tmp_path: os.PathLike[str], kms_id: str, secrets: dict[str, str]) -> StageRequest:
    return StageRequest(volume_id=VOLUME, staging_path=str(tmp_path), cluster_id="ceph", monitors="m",
                        image=ImageSpec("rbd", "img"), credentials=Credentials("csi", "k"),
                        access=VolumeAccess("mount", fs_type="ext4"), encryption=EncryptionSpec("file", kms_id),
                        secrets=secrets)


@pytest.fixture(autouse=True)
def no_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(JournalOwner, "beside", classmethod(lambda cls, meta: cls(None, 1.0, None, "", None)))
    monkeypatch.setattr(JournalOwner, "read", lambda self, volume_id: "tenant")


def test_a_kms_without_a_passphrase_gets_one_of_fscrypts_raw_key_size_once(tmp_path: os.PathLike[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume, "is_set_up", lambda mount_point: False)
    kept: dict[str, str] = {}
    stage = files(KeptKeys(kept))
    first = stage.secret(record(tmp_path), request(tmp_path, "kept", {}), EncryptionSpec("file", "kept"))
    assert first.source == wire.SOURCE_RAW_KEY and len(kept[VOLUME]) == keys.INTERNAL_KEY_LEN
    assert keys.raw_key(first.passphrase) == kept[VOLUME].encode()
    again = stage.secret(record(tmp_path), request(tmp_path, "kept", {}), EncryptionSpec("file", "kept"))
    assert again == first  # kept, never replaced


def test_a_set_up_volume_whose_kms_lost_the_passphrase_is_refused(tmp_path: os.PathLike[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume, "is_set_up", lambda mount_point: True)
    kept: dict[str, str] = {}
    with pytest.raises(FailedPrecondition, match="removed from the KMS"):
        files(KeptKeys(kept)).secret(record(tmp_path), request(tmp_path, "kept", {}), EncryptionSpec("file", "kept"))
    assert kept == {}


def test_default_kms_is_a_raw_key_of_the_secret_and_metadata_kms_a_passphrase_of_its_secret(
        tmp_path: os.PathLike[str]) -> None:
    config = os.path.join(tmp_path, "kms.json")
    with open(config, "w") as f:
        json.dump({"meta": {"encryptionKMSType": "metadata"}}, f)
    stage = files(VolumeKeys(config))
    secrets = {"encryptionPassphrase": "the class secret"}
    default = stage.secret(record(tmp_path), request(tmp_path, "default", secrets), EncryptionSpec("file", "default"))
    assert default == volume.ProtectorSecret.raw("the class secret")
    meta = stage.secret(record(tmp_path), request(tmp_path, "meta", secrets), EncryptionSpec("file", "meta"))
    assert meta == volume.ProtectorSecret.custom_passphrase("the class secret")


def test_raw_keys_are_cut_or_nul_padded_to_32_bytes() -> None:
    assert keys.raw_key("a" * 40) == b"a" * 32
    assert keys.raw_key("short") == b"short" + bytes(27)


def test_records_leave_out_proto3_defaults_and_skip_unknown_fields() -> None:
    wrapped = keys.wrap(bytes(32), os.urandom(64))
    policy = wire.Policy("ab" * 16, volume.OPTIONS, (wire.WrappedPolicyKey("cd" * 8, wrapped),))
    data = policy.encode()
    assert wire.Policy.decode(data) == policy
    # An unknown varint field (99) and fixed64 field (98) from a newer writer are skipped.
    extra = bytes([0x98, 0x06, 0x01]) + bytes([0x91, 0x06]) + bytes(8)
    assert wire.Policy.decode(data + extra) == policy
    assert wire.HashingCosts(0, 0, 0).encode() == b""
    assert keys.unwrap(bytes(32), wrapped) == keys.unwrap(bytes(32), wire.WrappedKey.decode(wrapped.encode()))
    with pytest.raises(keys.BadKey):
        keys.unwrap(bytes(31) + b"\x01", wrapped)
