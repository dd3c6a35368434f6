"""The KMS types whose secret is a passphrase from a Kubernetes Secret (ceph-csi's secretskms.go):
`default` (the secret is the passphrase) and `metadata` (a per-volume passphrase wrapped exactly
as ceph-csi wraps it, kept in the image). Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets as random
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cephcsi.encryption.kms import registry
from cephcsi.encryption.kms.base import Kms, KmsArgs
from cephcsi.errors import FailedPrecondition, InvalidArgument

PASSPHRASE_KEY = "encryptionPassphrase"
SECRET_NAME_KEY = "secretName"
SECRET_NAMESPACE_KEY = "secretNamespace"

SCRYPT_N = 32768
SCRYPT_R = 8
SCRYPT_P = 1
KEY_BYTES = 32
NONCE_BYTES = 12
_SCRYPT_MAXMEM = 2 * 128 * SCRYPT_R * SCRYPT_N  # hashlib's default (32 MiB) is just too small for N=2^15


def derive_key(passphrase: str, volume_id: str) -> bytes:
    return hashlib.scrypt(passphrase.encode(), salt=volume_id.encode(), n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P,
                          dklen=KEY_BYTES, maxmem=_SCRYPT_MAXMEM)


def wrap(passphrase: str, volume_id: str, dek: str) -> str:
    nonce = random.token_bytes(NONCE_BYTES)
    sealed = AESGCM(derive_key(passphrase, volume_id)).encrypt(nonce, dek.encode(), None)
    return json.dumps({"dek": base64.b64encode(sealed).decode(), "nonce": base64.b64encode(nonce).decode()},
                      separators=(",", ":"))


def unwrap(passphrase: str, volume_id: str, stored: str, where: str) -> str:
    try:
        doc = json.loads(stored)
        sealed = base64.b64decode(doc["dek"], validate=True)
        nonce = base64.b64decode(doc["nonce"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise FailedPrecondition(f"the wrapped passphrase of volume {volume_id} is not ceph-csi's "
                                 "{\"dek\",\"nonce\"} JSON; the image metadata was altered") from None
    try:
        return AESGCM(derive_key(passphrase, volume_id)).decrypt(nonce, sealed, None).decode()
    except (InvalidTag, ValueError):
        raise FailedPrecondition(f"the passphrase from {where} does not unwrap the passphrase of volume "
                                 f"{volume_id}: it is not the one the volume was created with") from None


def _call_passphrase(args: KmsArgs, kms_type: str) -> str:
    value = args.secrets.get(PASSPHRASE_KEY)
    if not value:
        raise InvalidArgument(f"KMS {args.kms_id!r} (type {kms_type}) needs {PASSPHRASE_KEY!r} in the "
                              "StorageClass secret (provisioner and node-stage secrets)")
    return value


class DefaultKms(Kms):
    """One passphrase, the Secret's, for every volume."""

    kms_type = "default"

    def __init__(self, args: KmsArgs) -> None:
        super().__init__(args.kms_id)
        self._passphrase = _call_passphrase(args, self.kms_type)

    @property
    def dek_in_image(self) -> bool:
        return False

    def store(self, volume_id: str, passphrase: str) -> None:
        pass  # nothing per volume: the passphrase is the Secret's

    def fetch(self, volume_id: str) -> str | None:
        return self._passphrase

    def remove(self, volume_id: str) -> None:
        pass


class SecretsMetadataKms(Kms):
    kms_type = "metadata"

    def __init__(self, args: KmsArgs) -> None:
        super().__init__(args.kms_id)
        self._passphrase, self._where = self._read(args)

    def _read(self, args: KmsArgs) -> tuple[str, str]:
        name = args.settings.get(SECRET_NAME_KEY)
        if name is None:
            return _call_passphrase(args, self.kms_type), "the StorageClass secret"
        namespace = args.settings.get(SECRET_NAMESPACE_KEY) or args.tenant
        if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
            raise InvalidArgument(f"KMS {args.kms_id!r} (type metadata): {SECRET_NAME_KEY} must name a Secret and "
                                  f"{SECRET_NAMESPACE_KEY} (or the claim's namespace) its namespace")
        where = f"Secret {namespace}/{name}"
        if args.secret_reader is None:
            raise FailedPrecondition(f"KMS {args.kms_id!r} (type metadata) reads {where}, but this driver has "
                                     "no Kubernetes API access (--kubeconfig / in-cluster)")
        data = args.secret_reader.read_secret(namespace, name)
        if data is None:
            raise FailedPrecondition(f"KMS {args.kms_id!r} (type metadata): {where} does not exist")
        value = data.get(PASSPHRASE_KEY)
        if not value:
            raise FailedPrecondition(f"KMS {args.kms_id!r} (type metadata): {where} has no {PASSPHRASE_KEY!r}")
        return value, where

    @property
    def dek_in_image(self) -> bool:
        return True

    def wrap(self, volume_id: str, passphrase: str) -> str:
        return wrap(self._passphrase, volume_id, passphrase)

    def unwrap(self, volume_id: str, stored: str) -> str:
        return unwrap(self._passphrase, volume_id, stored, self._where)


def _registered() -> Mapping[str, registry.Factory]:
    return {"default": DefaultKms, "metadata": SecretsMetadataKms}


for _type, _factory in _registered().items():
    registry.register(_type, _factory)
