"""What every KMS type offers, and the errors they raise: a type keeps a volume's passphrase either
wrapped in the image (`dek_in_image`: `wrap`/`unwrap`) or itself (`store`/`fetch`/`remove`). Design:
docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cephcsi.errors import Internal, Unavailable


class SecretReader(Protocol):
    """Reads a Kubernetes Secret for the KMS types that name one in their settings (the
    `metadata` type's secretName, vaulttokens' tenant tokens). Built by the composition root."""

    def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        """The Secret's data, decoded to text; None when it does not exist. Raises
        cephcsi.errors.Unavailable when the API server cannot be reached."""
        ...


@dataclass(frozen=True)
class KmsArgs:
    """What a KMS type is built from (ceph-csi's ProviderInitArgs)."""

    kms_id: str
    settings: Mapping[str, Any]
    """The ConfigMap section of `kms_id` (empty for the default type)."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    """The CSI call's secrets (the StorageClass provisioner/node-stage secret)."""
    tenant: str = ""
    """The namespace of the claim (ceph-csi's volume Owner), for per-tenant settings."""
    namespace: str = ""
    """The namespace the driver runs in (ceph-csi's POD_NAMESPACE), may be empty."""
    secret_reader: SecretReader | None = None


class KmsUnavailable(Unavailable):
    """The KMS could not be reached or answered with a temporary failure; retry later."""

    def __init__(self, kms_id: str, kms_type: str, why: str) -> None:
        super().__init__(f"KMS {kms_id!r} (type {kms_type}) is unavailable: {why}")
        self.kms_id = kms_id
        self.kms_type = kms_type


class Kms(ABC):
    """One configured KMS, built for one call (it may hold the call's secrets)."""

    kms_type: str = ""

    def __init__(self, kms_id: str) -> None:
        self.kms_id = kms_id

    @property
    @abstractmethod
    def dek_in_image(self) -> bool:
        """True: the passphrase is kept wrapped in the image metadata (wrap/unwrap);
        False: the KMS keeps it (store/fetch/remove)."""

    def describe(self) -> str:
        return f"KMS {self.kms_id!r} (type {self.kms_type})"

    # dek_in_image types
    def wrap(self, volume_id: str, passphrase: str) -> str:
        """The text to keep in the image metadata for this volume's passphrase."""
        raise Internal(f"{self.describe()} keeps passphrases itself; it does not wrap them")

    def unwrap(self, volume_id: str, stored: str) -> str:
        """The passphrase from what `wrap` returned (or ceph-csi stored)."""
        raise Internal(f"{self.describe()} keeps passphrases itself; it does not unwrap them")

    # types that keep the passphrase themselves
    def store(self, volume_id: str, passphrase: str) -> None:
        """Keep the passphrase under the volume id (replacing any)."""
        raise Internal(f"{self.describe()} keeps passphrases in the image metadata; it does not store them")

    def fetch(self, volume_id: str) -> str | None:
        """The passphrase kept for the volume id; None when the KMS has none for it."""
        raise Internal(f"{self.describe()} keeps passphrases in the image metadata; it does not fetch them")

    def remove(self, volume_id: str) -> None:
        """Forget the volume's passphrase; nothing kept counts as removed."""
        raise Internal(f"{self.describe()} keeps passphrases in the image metadata; it does not remove them")

    def close(self) -> None:
        """Release connections; the instance is not used afterwards."""
