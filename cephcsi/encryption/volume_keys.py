"""A volume's passphrase, kept where ceph-csi keeps it (image metadata `rbd.csi.ceph.com/encrypted`
and `rbd.csi.ceph.com/dek`, or the KMS): the facade the controller (create, copy, remove) and the
node (read, mark formatted) call. Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import base64
import logging
import secrets as random
from collections.abc import Callable, Mapping
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
                 target_spec: EncryptionSpec, secrets: Mapping[str, str], tenant: str = "",
                 confirm: Callable[[], None] | None = None) -> None:
        """A clone, restore or snapshot image gets the passphrase its copy of the source's LUKS
        header opens with, kept under its own id through the target's KMS, and the source's state
        (ceph-csi's copyEncryptionConfig). Idempotent: a passphrase already kept for the target is
        kept, never replaced by what the source has now.

        Which passphrase: the one the source had at the cut, not its current one (a key rotation
        since the cut changed that, and the copy's header does not open with the new one).
        - A source KMS that keeps the wrapped passphrase in the image (`dek_in_image`): the wrapped
          copy librbd's clone carried into the target's metadata with the header, so the cut's by
          construction, unwrapped under the source's id (FailedPrecondition when it was wrapped
          for another id: the caller tries the next) and wrapped again for the target's. A source
          keeping it under ceph-csi's older `.`-key (which librbd does not copy) is read as below.
        - A KMS that keeps it itself: its current passphrase for the source, which is the cut's
          only while the source's rotation lock has been held since the cut; `confirm` (given by
          a caller holding that lock) checks so after the read and raises when it lapsed."""
        inherited = image_metadata.read(target.io, target.image_name)
        # The state librbd copied with the rest of the metadata is the source's when the clone
        # was cut: the source may have been formatted since ("encrypted"), while the clone's data
        # is what it was then (no LUKS header yet, "encryptionPrepared").
        source_state = (state_of(inherited) or state_of(image_metadata.read(source.io, source.image_name))
                        or PREPARED)
        kms = self.kms(target_spec, secrets, tenant)
        try:
            if _kept_for(kms, target.volume_id, inherited) is None:
                passphrase = self._cut_passphrase(source, source_spec, target, inherited, secrets, tenant, confirm)
                if kms.dek_in_image:
                    image_metadata.ensure(target.io, target.image_name,
                                          {DEK_KEY: kms.wrap(target.volume_id, passphrase)})
                else:
                    kms.store(target.volume_id, passphrase)
        finally:
            kms.close()
        image_metadata.ensure(target.io, target.image_name, {STATE_KEY: source_state})

    def _cut_passphrase(self, source: ImageRef, source_spec: EncryptionSpec, target: ImageRef,
                        inherited: Mapping[str, str], secrets: Mapping[str, str], tenant: str,
                        confirm: Callable[[], None] | None) -> str:
        kms = self.kms(source_spec, secrets, tenant)
        try:
            if kms.dek_in_image:
                wrapped = wrapped_dek_of(inherited)
                if wrapped:
                    return kms.unwrap(source.volume_id, wrapped)
                # librbd's clone does not copy metadata keys that start with "." (ceph-csi's
                # older .rbd.csi.ceph.com/dek): the source's current one, as for the KMS below.
                found = kms.unwrap(source.volume_id, self._wrapped_of(source))
            else:
                found = self._fetched(kms, source.volume_id)
            if confirm is not None:
                confirm()
            return found
        finally:
            kms.close()

    @staticmethod
    def _wrapped_of(image: ImageRef) -> str:
        wrapped = wrapped_dek_of(image_metadata.read(image.io, image.image_name))
        if not wrapped:
            raise FailedPrecondition(
                f"encrypted image {image.image_name!r} has no passphrase in its metadata ({DEK_KEY}); "
                "its CreateVolume did not finish: run `cephcsi audit`")
        return wrapped

    @staticmethod
    def _fetched(kms: Kms, volume_id: str) -> str:
        found = kms.fetch(volume_id)
        if found is None:
            raise FailedPrecondition(
                f"{kms.describe()} keeps no passphrase for volume {volume_id}; "
                "its CreateVolume did not finish, or the key was removed from the KMS")
        return found

    def copy_reads_source_now(self, spec: EncryptionSpec, target: ImageRef, secrets: Mapping[str, str],
                              tenant: str = "") -> bool:
        """Whether copy_key would give `target` (a copy of a volume of `spec`) the source's
        current passphrase rather than the wrapped one carried in its own metadata: for a KMS
        that keeps passphrases itself, or a copy that carries none (see _cut_passphrase)."""
        kms = self.kms(spec, secrets, tenant)
        try:
            return not kms.dek_in_image or not wrapped_dek_of(image_metadata.read(target.io, target.image_name))
        finally:
            kms.close()

    def keeps_key(self, image: ImageRef, spec: EncryptionSpec, secrets: Mapping[str, str], tenant: str = "") -> bool:
        """Whether a passphrase is kept for `image` under its own id (a copy_key finished)."""
        kms = self.kms(spec, secrets, tenant)
        try:
            return _kept_for(kms, image.volume_id, image_metadata.read(image.io, image.image_name)) is not None
        finally:
            kms.close()

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


def _kept_for(kms: Kms, volume_id: str, metadata: Mapping[str, str]) -> str | None:
    """The passphrase `kms` keeps for `volume_id` (wrapped in `metadata`, the image's, for the
    types that keep it there), or None. A wrapped copy inherited from a source, wrapped for the
    source's id, does not unwrap under this id: None."""
    if not kms.dek_in_image:
        return kms.fetch(volume_id)
    wrapped = wrapped_dek_of(metadata)
    if not wrapped:
        return None
    try:
        return kms.unwrap(volume_id, wrapped)
    except (InvalidArgument, FailedPrecondition):
        return None
