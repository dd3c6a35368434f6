"""ceph-csi's `metadata` KMS wrapping (internal/kms/secretskms.go), reproduced independently with
the `cryptography` package's own scrypt and AES-GCM, against cephcsi.encryption.kms.secrets in
both directions: either driver opens the other's wrapped passphrases."""
from __future__ import annotations

import base64
import json
import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from cephcsi.encryption.kms import secrets
from cephcsi.encryption.kms.base import KmsArgs
from cephcsi.encryption.volume_keys import new_passphrase
from cephcsi.errors import FailedPrecondition, InvalidArgument

pytestmark = pytest.mark.unit

VOLUME_ID = "0001-0009-rook-ceph-0000000000000002-3c7d8a8e-4b35-4f21-9d0a-6f2b1c7e9a11"


def go_key(passphrase: str, salt: str) -> bytes:
    # scrypt.Key([]byte(passphrase), []byte(salt), 32768, 8, 1, 32)
    return Scrypt(salt=salt.encode(), length=32, n=32768, r=8, p=1).derive(passphrase.encode())


def go_wrap(passphrase: str, volume_id: str, dek: str) -> str:
    nonce = os.urandom(12)  # cipher.NewGCM's NonceSize()
    sealed = AESGCM(go_key(passphrase, volume_id)).encrypt(nonce, dek.encode(), None)
    # json.Marshal of struct{DEK []byte `json:"dek"`; Nonce []byte `json:"nonce"`}
    return '{"dek":"%s","nonce":"%s"}' % (base64.b64encode(sealed).decode(), base64.b64encode(nonce).decode())


def go_unwrap(passphrase: str, volume_id: str, stored: str) -> str:
    doc = json.loads(stored)
    return AESGCM(go_key(passphrase, volume_id)).decrypt(
        base64.b64decode(doc["nonce"]), base64.b64decode(doc["dek"]), None).decode()


def test_ceph_csi_wrapped_passphrase_unwraps() -> None:
    dek = new_passphrase()
    stored = go_wrap("sc-secret", VOLUME_ID, dek)
    assert secrets.unwrap("sc-secret", VOLUME_ID, stored, "test") == dek


def test_cephcsi_wrapped_passphrase_unwraps_the_ceph_csi_way() -> None:
    dek = new_passphrase()
    stored = secrets.wrap("sc-secret", VOLUME_ID, dek)
    assert go_unwrap("sc-secret", VOLUME_ID, stored) == dek
    doc = json.loads(stored)
    assert list(doc) == ["dek", "nonce"] and " " not in stored
    assert len(base64.b64decode(doc["nonce"])) == 12
    assert len(base64.b64decode(doc["dek"])) == len(dek) + 16  # GCM tag


def test_the_volume_id_is_the_salt() -> None:
    stored = secrets.wrap("sc-secret", VOLUME_ID, "x")
    with pytest.raises(FailedPrecondition, match="not the one the volume was created with"):
        secrets.unwrap("sc-secret", VOLUME_ID + "0", stored, "test")


def test_a_wrong_passphrase_names_where_it_came_from_not_the_secret() -> None:
    stored = secrets.wrap("right", VOLUME_ID, "dek-value")
    with pytest.raises(FailedPrecondition) as caught:
        secrets.unwrap("wrong-one", VOLUME_ID, stored, "Secret ns/name")
    assert "Secret ns/name" in str(caught.value)
    assert "wrong-one" not in str(caught.value) and "dek-value" not in str(caught.value)


def test_altered_metadata_is_refused_clearly() -> None:
    with pytest.raises(FailedPrecondition, match="not ceph-csi's"):
        secrets.unwrap("p", VOLUME_ID, "{\"dek\": 1}", "test")


def test_passphrase_is_20_bytes_base64url_padded() -> None:
    value = new_passphrase()
    assert len(value) == 28 and value.endswith("=")
    assert len(base64.urlsafe_b64decode(value)) == 20
    assert new_passphrase() != value


def test_default_kms_passphrase_is_the_secrets() -> None:
    kms = secrets.DefaultKms(KmsArgs("default", {}, {"encryptionPassphrase": "from-secret"}))
    assert not kms.dek_in_image and kms.fetch("any") == "from-secret"
    with pytest.raises(InvalidArgument, match="encryptionPassphrase"):
        secrets.DefaultKms(KmsArgs("default", {}, {}))


class Reader:
    def __init__(self, data: dict[tuple[str, str], dict[str, str]]) -> None:
        self.data = data

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.data.get((namespace, name))


def test_metadata_kms_reads_the_named_secret_in_the_tenants_namespace() -> None:
    reader = Reader({("team-a", "kek"): {"encryptionPassphrase": "tenant-pass"}})
    kms = secrets.SecretsMetadataKms(KmsArgs("m", {"secretName": "kek"}, {}, tenant="team-a", secret_reader=reader))
    stored = kms.wrap(VOLUME_ID, "dek")
    assert go_unwrap("tenant-pass", VOLUME_ID, stored) == "dek"
    with pytest.raises(FailedPrecondition, match="team-b/kek does not exist"):
        secrets.SecretsMetadataKms(KmsArgs("m", {"secretName": "kek"}, {}, tenant="team-b", secret_reader=reader))
