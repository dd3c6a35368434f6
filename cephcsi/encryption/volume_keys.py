"""A volume's passphrase, kept where ceph-csi keeps it: the facade the controller (create, copy,
remove) and the node (read, mark formatted) call.

ceph-csi's layout on the image (internal/rbd/encryption.go), which both drivers read and write:
- `rbd.csi.ceph.com/encrypted` (older `.rbd.csi.ceph.com/encrypted`): "encryptionPrepared" once
  the passphrase is kept, "encrypted" once a node formatted LUKS on the image;
- `rbd.csi.ceph.com/dek` (older `.rbd.csi.ceph.com/dek`): the passphrase wrapped by the KMS, for
  the types that keep it in the image (Kms.dek_in_image).
The passphrase is 20 random bytes, base64url with padding (28 characters); LUKS is opened with
that text, under the device-mapper name `luks-rbd-<volume id>`.
"""
from __future__ import annotations

import base64
import logging
import secrets as random
from collections.abc import Mapping
from dataclasses import dataclass

import rados

from cephcsi.ceph import image_metadata
from cephcsi.encryption import kms_config
from cephcsi.encryption.kms import registry
from cephcsi.encryption.kms.base import Kms, SecretReader
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import FailedPrecondition, InvalidArgument
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

STATE_KEY = "rbd.csi.ceph.com/encrypted"
OLD_STATE_KEY = ".rbd.csi.ceph.com/encrypted"
DEK_KEY = "rbd.csi.ceph.com/dek"
OLD_DEK_KEY = ".rbd.csi.ceph.com/dek"
PREPARED = "encryptionPrepared"
ENCRYPTED = "encrypted"

RECORD_KMS_KEY = "csi.volume.encryptKMS"
RECORD_TYPE_KEY = "csi.volume.encryptionType"
"""The journal record's keys (ceph-csi's voljournal.go) naming a volume's KMS id and type."""

IMAGE_KEPT_TYPES = ("metadata",)
"""KMS types that keep the passphrase in the image only (nothing to remove after a delete)."""

PASSPHRASE_BYTES = 20
MAPPER_PREFIX = "luks-rbd-"


def new_passphrase() -> str:
    return base64.urlsafe_b64encode(random.token_bytes(PASSPHRASE_BYTES)).decode()


def mapper_name(volume_id: str) -> str:
    """The device-mapper name ceph-csi opens a volume's LUKS under (/dev/mapper/<this>)."""
    return MAPPER_PREFIX + volume_id


def record_values(spec: EncryptionSpec | None) -> dict[str, str]:
    """The journal record's encryption keys for a volume of `spec` (none when unencrypted)."""
    if spec is None:
        return {}
    return {RECORD_KMS_KEY: spec.kms_id, RECORD_TYPE_KEY: spec.type}


def spec_of_record(values: Mapping[str, str]) -> EncryptionSpec | None:
    """The encryption a journal record names (ours or ceph-csi's); None when unencrypted."""
    kms_id = values.get(RECORD_KMS_KEY, "")
    if not kms_id:
        return None
    return EncryptionSpec(type=values.get(RECORD_TYPE_KEY, "") or "block", kms_id=kms_id)


def _first(metadata: Mapping[str, str], key: str, old_key: str) -> str:
    return (metadata.get(key) or metadata.get(old_key) or "").strip()


def state_of(metadata: Mapping[str, str]) -> str:
    """The encryption state in an image's metadata: "" (not set), PREPARED or ENCRYPTED."""
    return _first(metadata, STATE_KEY, OLD_STATE_KEY)


def wrapped_dek_of(metadata: Mapping[str, str]) -> str:
    return _first(metadata, DEK_KEY, OLD_DEK_KEY)


@dataclass(frozen=True)
class ImageRef:
    """An image and the volume (or snapshot) id its passphrase is kept under."""

    io: rados.Ioctx
    image_name: str
    volume_id: str


class VolumeKeys:
    def __init__(self, kms_config_path: str = kms_config.DEFAULT_PATH, secret_reader: SecretReader | None = None,
                 namespace: str = "") -> None:
        self.kms_config_path = kms_config_path
        self.secret_reader = secret_reader
        self.namespace = namespace

    def check(self, spec: EncryptionSpec, secrets: Mapping[str, str] | None = None, tenant: str = "") -> None:
        """InvalidArgument when the spec's KMS id is not configured or its type is not supported;
        given the call's secrets, the KMS is also built (its passphrase or Secret read), so a
        missing one is refused too. Called before anything is created."""
        if not spec.is_default_kms:
            settings = kms_config.section(self.kms_config_path, spec.kms_id)
            registry.check_type(spec.kms_id, registry.type_of(spec.kms_id, settings))
        if secrets is not None:
            self.kms(spec, secrets, tenant).close()

    def kms(self, spec: EncryptionSpec, secrets: Mapping[str, str], tenant: str = "") -> Kms:
        settings = {} if spec.is_default_kms else kms_config.section(self.kms_config_path, spec.kms_id)
        return registry.build(spec.kms_id, settings, secrets, tenant=tenant, namespace=self.namespace,
                              secret_reader=self.secret_reader)

    # controller

    def prepare_key(self, volume_id: str, spec: EncryptionSpec, secrets: Mapping[str, str],
                    tenant: str = "") -> None:
        """Before the image of a new volume exists: a KMS that keeps passphrases itself gets one
        for the volume id (or keeps the one it has), so a KMS that is down fails the call
        before there is an image (UNAVAILABLE naming the KMS). Types that keep it in the image
        do nothing here."""
        kms = self.kms(spec, secrets, tenant)
        try:
            if not kms.dek_in_image and kms.fetch(volume_id) is None:
                kms.store(volume_id, new_passphrase())
                log.info("volume passphrase kept by the KMS", extra=fields(volume_id=volume_id, kms=spec.kms_id))
        finally:
            kms.close()

    def create_key(self, image: ImageRef, spec: EncryptionSpec, secrets: Mapping[str, str],
                   tenant: str = "") -> None:
        """Give a new image its passphrase and mark it prepared. Idempotent and crash-safe: a
        passphrase already kept for it is kept (never a second one), and the state is written
        only after the passphrase, so an image marked prepared always has one."""
        kms = self.kms(spec, secrets, tenant)
        try:
            metadata = image_metadata.read(image.io, image.image_name)
            if kms.dek_in_image:
                if not wrapped_dek_of(metadata):
                    wrapped = kms.wrap(image.volume_id, new_passphrase())
                    image_metadata.ensure(image.io, image.image_name, {DEK_KEY: wrapped}, known_empty=False)
                    log.info("volume passphrase kept in the image metadata",
                             extra=fields(image=image.image_name, kms=spec.kms_id))
            elif kms.fetch(image.volume_id) is None:
                kms.store(image.volume_id, new_passphrase())
                log.info("volume passphrase kept by the KMS", extra=fields(image=image.image_name, kms=spec.kms_id))
            if not state_of(metadata):
                image_metadata.ensure(image.io, image.image_name, {STATE_KEY: PREPARED})
        finally:
            kms.close()

    def copy_key(self, source: ImageRef, source_spec: EncryptionSpec, target: ImageRef,
                 target_spec: EncryptionSpec, secrets: Mapping[str, str], tenant: str = "") -> None:
        """A clone, restore or snapshot image gets its source's passphrase (it holds a copy of the
        source's LUKS header), kept under its own id through the target's KMS, and the
        source's state (ceph-csi's copyEncryptionConfig). Idempotent: the same passphrase is
        written again on a retry. The wrapped copy librbd carried over from the source's
        metadata is replaced (it is wrapped for the source's id, not the target's)."""
        passphrase = self.passphrase(source, source_spec, secrets, tenant)
        inherited = image_metadata.read(target.io, target.image_name)
        # The state librbd copied with the rest of the metadata is the source's when the clone
        # was cut: the source may have been formatted since ("encrypted"), while the clone's data
        # is what it was then (no LUKS header yet, "encryptionPrepared").
        source_state = (state_of(inherited) or state_of(image_metadata.read(source.io, source.image_name))
                        or PREPARED)
        kms = self.kms(target_spec, secrets, tenant)
        try:
            if kms.dek_in_image:
                current = wrapped_dek_of(inherited)
                if not current or _unwraps_to(kms, target.volume_id, current) != passphrase:
                    image_metadata.ensure(target.io, target.image_name,
                                          {DEK_KEY: kms.wrap(target.volume_id, passphrase)})
            elif kms.fetch(target.volume_id) != passphrase:
                kms.store(target.volume_id, passphrase)
        finally:
            kms.close()
        image_metadata.ensure(target.io, target.image_name, {STATE_KEY: source_state})

    def remove_key(self, volume_id: str, spec: EncryptionSpec, secrets: Mapping[str, str],
                   tenant: str = "") -> None:
        """After the image is gone: forget the passphrase a KMS keeps for it (nothing to do for
        the types that kept it in the image). Retry-safe: nothing kept counts as removed."""
        if spec.is_default_kms or registry.type_of(
                spec.kms_id, kms_config.section(self.kms_config_path, spec.kms_id)) in IMAGE_KEPT_TYPES:
            return  # nothing outside the image; building the KMS would only read its secret
        kms = self.kms(spec, secrets, tenant)
        try:
            if not kms.dek_in_image:
                kms.remove(volume_id)
        finally:
            kms.close()

    # node

    def passphrase(self, image: ImageRef, spec: EncryptionSpec, secrets: Mapping[str, str],
                   tenant: str = "") -> str:
        """The passphrase LUKS is opened (or formatted) with; FailedPrecondition when none is kept."""
        kms = self.kms(spec, secrets, tenant)
        try:
            if kms.dek_in_image:
                wrapped = wrapped_dek_of(image_metadata.read(image.io, image.image_name))
                if not wrapped:
                    raise FailedPrecondition(
                        f"encrypted image {image.image_name!r} has no passphrase in its metadata ({DEK_KEY}); "
                        "its CreateVolume did not finish: run `cephcsi audit`"
                    )
                return kms.unwrap(image.volume_id, wrapped)
            found = kms.fetch(image.volume_id)
            if found is None:
                raise FailedPrecondition(
                    f"{kms.describe()} keeps no passphrase for volume {image.volume_id}; "
                    "its CreateVolume did not finish, or the key was removed from the KMS"
                )
            return found
        finally:
            kms.close()

    @staticmethod
    def state(io: rados.Ioctx, image_name: str) -> str:
        """The image's encryption state ("" unset, PREPARED, ENCRYPTED)."""
        return state_of(image_metadata.read(io, image_name))

    @staticmethod
    def mark_encrypted(io: rados.Ioctx, image_name: str) -> None:
        """After luksFormat: the image holds LUKS now (ceph-csi's state "encrypted")."""
        image_metadata.ensure(io, image_name, {STATE_KEY: ENCRYPTED})


def _unwraps_to(kms: Kms, volume_id: str, wrapped: str) -> str | None:
    try:
        return kms.unwrap(volume_id, wrapped)
    except (InvalidArgument, FailedPrecondition):
        return None
