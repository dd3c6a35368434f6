"""Whether a volume is encrypted, how, and with which KMS: ceph-csi's StorageClass keys
`encrypted`, `encryptionType` and `encryptionKMSID`, read from the CreateVolume parameters
(controller) or the volume context (node, which gets them back from the controller).

ceph-csi reads `encrypted` with Go's strconv.ParseBool, so the same spellings are accepted here;
an encrypted volume without `encryptionKMSID` uses the KMS named "default" (the passphrase of the
StorageClass secret), and one without `encryptionType` is block (LUKS2).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cephcsi.errors import InvalidArgument

ENCRYPTED_KEY = "encrypted"
TYPE_KEY = "encryptionType"
KMS_ID_KEY = "encryptionKMSID"
KEYS = (ENCRYPTED_KEY, TYPE_KEY, KMS_ID_KEY)

BLOCK = "block"
FILE = "file"
TYPES = (BLOCK, FILE)
DEFAULT_KMS_ID = "default"
"""ceph-csi's kms.DefaultKMSType: no ConfigMap section, the secret's encryptionPassphrase."""

_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


@dataclass(frozen=True)
class EncryptionSpec:
    type: str
    """"block" (LUKS2 on the image) or "file" (fscrypt in the filesystem)."""
    kms_id: str
    """A section of the KMS ConfigMap, or DEFAULT_KMS_ID."""

    @property
    def is_default_kms(self) -> bool:
        return self.kms_id == DEFAULT_KMS_ID

    def volume_context(self) -> dict[str, str]:
        """The keys the node needs, as ceph-csi passes them (its volume context carries the
        StorageClass parameters); an unset KMS id stays unset."""
        context = {ENCRYPTED_KEY: "true", TYPE_KEY: self.type}
        if not self.is_default_kms:
            context[KMS_ID_KEY] = self.kms_id
        return context


def parse_bool(key: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InvalidArgument(f"parameter {key}={value!r} is not a boolean (use \"true\" or \"false\")")


def from_parameters(params: Mapping[str, str]) -> EncryptionSpec | None:
    """The encryption a StorageClass asks for; None when `encrypted` is unset or false."""
    raw = params.get(ENCRYPTED_KEY)
    if raw is None or not parse_bool(ENCRYPTED_KEY, raw):
        return None
    kind = params.get(TYPE_KEY, BLOCK)
    if kind not in TYPES:
        # ceph-csi treats a present but empty encryptionType as invalid too.
        raise InvalidArgument(f"parameter {TYPE_KEY}={kind!r} is not one of: {', '.join(TYPES)}")
    kms_id = params.get(KMS_ID_KEY, "") or DEFAULT_KMS_ID
    return EncryptionSpec(type=kind, kms_id=kms_id)


def from_volume_context(ctx: Mapping[str, str]) -> EncryptionSpec | None:
    """The same keys, as the node receives them (from this driver's controller or ceph-csi's)."""
    return from_parameters(ctx)
