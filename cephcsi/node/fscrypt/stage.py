"""The fscrypt steps of staging a file-encrypted volume (ceph-csi's `encryptionType: file`): after
the staging mount, unlock (first stage: set up) `<mount>/ceph-csi-encrypted`; publish binds that
directory; before the unmount, its key leaves the filesystem keyring.

Which secret opens the "ceph-csi" protector follows ceph-csi per KMS type; a passphrase the KMS
keeps is never replaced. docs/design/node.md, "fscrypt: file encryption".
"""
from __future__ import annotations

import base64
import secrets
from collections.abc import Callable

from cephcsi.encryption import volume_keys
from cephcsi.encryption.kms.secrets import SecretsMetadataKms
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import FailedPrecondition
from cephcsi.node.fscrypt import volume
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.journal_owner import JournalOwner
from cephcsi.node.luks_keys import KeySource, KmsKeys
from cephcsi.node.requests import StageRequest
from cephcsi.node.stage_record import StageRecord


def new_passphrase() -> str:
    """32 characters (24 random bytes, base64url): exactly google/fscrypt's raw key size, so
    ceph-csi's first attempt (the passphrase at its own length) opens it too."""
    return base64.urlsafe_b64encode(secrets.token_bytes(24)).decode()


class FileStage:
    def __init__(self, keys: Callable[[], KeySource], metadata: Callable[[StageRequest], RbdImageMetadata]) -> None:
        self._keys = keys
        self.metadata = metadata

    def _volume_keys(self) -> volume_keys.VolumeKeys:
        source = self._keys()
        return source.keys if isinstance(source, KmsKeys) else volume_keys.VolumeKeys()

    def secret(self, record: StageRecord, request: StageRequest, spec: EncryptionSpec) -> volume.ProtectorSecret:
        owner = "" if spec.is_default_kms else JournalOwner.beside(self.metadata(request)).read(record.volume_id)
        kms = self._volume_keys().kms(spec, request.secrets, owner)
        try:
            if kms.dek_in_image:
                if not isinstance(kms, SecretsMetadataKms):
                    raise FailedPrecondition(f"{kms.describe()} cannot protect file-encrypted volumes here: only the "
                                             "`metadata` type among the KMS types that keep keys in the image does")
                # ceph-csi's GetSecret: the KMS's secret itself, read when the KMS was built.
                return volume.ProtectorSecret.custom_passphrase(kms._passphrase)  # noqa: SLF001
            found = kms.fetch(record.volume_id)
            if found is None:
                if volume.is_set_up(record.mount_path):
                    raise FailedPrecondition(
                        f"{kms.describe()} keeps no passphrase for volume {record.volume_id}, whose encrypted "
                        "directory is set up already: the key was removed from the KMS"
                    )
                # ceph-csi's controller keeps nothing for a file-encrypted volume; its node keeps a new
                # passphrase at the first stage. Kept before any protector uses it, so a retry after
                # a kill finds it.
                found = new_passphrase()
                kms.store(record.volume_id, found)
            return volume.ProtectorSecret.raw(found)
        finally:
            kms.close()

    def unlock(self, record: StageRecord, request: StageRequest, spec: EncryptionSpec) -> None:
        if volume.is_unlocked(record.mount_path):
            return  # a resumed stage: the key is in the keyring already, no KMS call needed
        volume.unlock(record.mount_path, self.secret(record, request, spec), read_only=record.read_only)

    @staticmethod
    def lock(record: StageRecord) -> None:
        volume.lock(record.mount_path)

    @staticmethod
    def unlocked(record: StageRecord) -> bool:
        return volume.is_unlocked(record.mount_path)
