"""Where the node gets an encrypted volume's passphrase: the KMS facade of cephcsi.encryption,
over the image metadata the node read itself (cephcsi.node.image_meta: the node has no librados
connection, so it hands the facade the metadata mapping instead of an Ioctx).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from cephcsi.encryption import volume_keys
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import FailedPrecondition


Tenant = Callable[[], str]
"""Reads the volume's tenant (claim namespace) when a KMS needs it (cephcsi.node.journal_owner)."""


class KeySource(Protocol):
    def passphrase(self, metadata: Mapping[str, str], volume_id: str, spec: EncryptionSpec,
                   secrets: Mapping[str, str], tenant: Tenant | None = None) -> str:
        """The passphrase LUKS is formatted and opened with."""
        ...


class KmsKeys:
    """ceph-csi's rules through the KMS types cephcsi.encryption registers: the passphrase kept
    wrapped in the image metadata (`metadata`...) or kept by the KMS (vault; and the default KMS,
    whose "kept" passphrase is the StorageClass secret's encryptionPassphrase)."""

    def __init__(self, keys: volume_keys.VolumeKeys | None = None) -> None:
        self.keys = keys or volume_keys.VolumeKeys()

    def passphrase(self, metadata: Mapping[str, str], volume_id: str, spec: EncryptionSpec,
                   secrets: Mapping[str, str], tenant: Tenant | None = None) -> str:
        # ceph-csi's node reads the owner for every KMS; the default one has no settings that
        # could name a tenant, so its stages skip that read.
        owner = tenant() if tenant is not None and not spec.is_default_kms else ""
        kms = self.keys.kms(spec, secrets, owner)
        try:
            if kms.dek_in_image:
                wrapped = volume_keys.wrapped_dek_of(metadata)
                if not wrapped:
                    raise FailedPrecondition(
                        f"encrypted volume {volume_id} has no passphrase in its image metadata "
                        f"({volume_keys.DEK_KEY}); its CreateVolume did not finish: run `cephcsi audit`"
                    )
                return kms.unwrap(volume_id, wrapped)
            found = kms.fetch(volume_id)
            if found is None:
                raise FailedPrecondition(
                    f"{kms.describe()} keeps no passphrase for volume {volume_id}; its CreateVolume did not finish, "
                    "or the key was removed from the KMS"
                )
            return found
        finally:
            kms.close()
