"""The controller's half of encrypted volumes: a new volume's passphrase, a clone's or restore's
copy of its source's, and the KMS's copy removed after a delete; called inside the CreateVolume
and DeleteVolume flows, under their journal lease. Design: docs/design/controller.md.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from cephcsi.ceph import image_metadata, rotation_lock
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.encryption import volume_keys
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.encryption.volume_keys import ImageRef, VolumeKeys
from cephcsi.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from cephcsi.observability.logging import fields
from cephcsi.volumes import sources
from cephcsi.volumes.clones import ContentSource
from cephcsi.volumes.journal import Record

log = logging.getLogger(__name__)

OWNER_KEY = "csi.volume.owner"
"""ceph-csi's record key of the claim's namespace (its volume Owner): the KMS tenant."""
SOURCE_VOLUME_ID = "csi.source.volumeid"
"""A cephcsi snapshot record's source volume (cephcsi.volumes.snapshots)."""


def spec_of(record: Record) -> EncryptionSpec | None:
    return volume_keys.spec_of_record({key: record.get(key)
                                       for key in (volume_keys.RECORD_KMS_KEY, volume_keys.RECORD_TYPE_KEY)})


def record_values_of(source: Record) -> dict[str, str]:
    """The encryption keys (KMS, type, owner) a snapshot's record copies from its source's."""
    values = volume_keys.record_values(spec_of(source))
    if values and source.get(OWNER_KEY):
        values[OWNER_KEY] = source.get(OWNER_KEY)
    return values


@dataclass(frozen=True)
class SourceKey:
    """Where a source's passphrase is: its image, the ids it may be kept under, its KMS."""

    spec: EncryptionSpec | None
    state: str
    image_name: str
    key_ids: tuple[str, ...]

    @property
    def encrypted(self) -> bool:
        return self.spec is not None or bool(self.state)


class Encryption:
    def __init__(self, keys: VolumeKeys, instance_id: str, lock_seconds: float, keeper: LeaseKeeper) -> None:
        self.keys = keys
        self.instance_id = instance_id
        self.lock_seconds = lock_seconds
        self.keeper = keeper
        self._held: dict[str, rotation_lock.Held] = {}
        """Clones' rotation locks (source_held) by the new volume's id, for `settle`."""

    def check(self, spec: EncryptionSpec | None, secrets: Mapping[str, str], tenant: str) -> None:
        """Before anything is reserved: the KMS id is configured, its type supported, and it
        builds from the call's secrets (a missing passphrase or Secret is refused here)."""
        if spec is not None:
            self.keys.check(spec, secrets, tenant)

    @staticmethod
    def require_same(name: str, record: Record, wanted: EncryptionSpec | None) -> None:
        """A retried CreateVolume must ask for the encryption the volume was made with (ceph-csi
        refuses a KMS that differs from its reservation's too)."""
        found = spec_of(record)
        if found != wanted:
            def say(spec: EncryptionSpec | None) -> str:
                return f"encrypted with KMS {spec.kms_id!r} ({spec.type})" if spec else "unencrypted"
            raise AlreadyExists(f"volume {name!r} already exists {say(found)}, but the request asks for it "
                                f"{say(wanted)}")

    def prepare(self, volume_id: str, spec: EncryptionSpec | None, source: ContentSource | None,
                secrets: Mapping[str, str], tenant: str) -> None:
        """After the record, before the image: a KMS that keeps keys itself has this new volume's
        (VolumeKeys.prepare_key); a clone or restore gets its source's after the image instead."""
        if spec is not None and source is None:
            self.keys.prepare_key(volume_id, spec, secrets, tenant)

    def source(self, session: Session, source: ContentSource, read_state: bool = True) -> SourceKey | None:
        """The source's encryption, or None when it cannot be read (the clone then fails on its own).
        `read_state`: also read the image's state when the record names no KMS."""
        entry_id = sources.decode(source.source_id, f"source {source.kind}")
        with sources.opened(session, entry_id, f"source {source.kind}") as (_, io):
            if source.kind == "volume":
                journal = sources.volume_journal(io, self.instance_id, self.lock_seconds, self.keeper, session)
            else:
                journal = sources.snapshot_journal(io, self.instance_id, self.lock_seconds, self.keeper, session)
            record = journal.read(entry_id.object_uuid)
            if record is None:
                return None
            spec = spec_of(record)
            if spec is None and not read_state:
                # Both drivers journal the KMS of every encrypted volume and snapshot: an
                # unencrypted request from a source without one costs no image open.
                return SourceKey(None, "", record.image_name, (source.source_id,))
            state = volume_keys.state_of(image_metadata.read(io, record.image_name))
            ids: tuple[str, ...] = (source.source_id,)
            if source.kind == "snapshot" and record.get(SOURCE_VOLUME_ID):
                ids = (source.source_id, record.get(SOURCE_VOLUME_ID))
            return SourceKey(spec, state, record.image_name, ids)

    @staticmethod
    def require_compatible(wanted: EncryptionSpec | None, source: ContentSource, found: SourceKey | None) -> None:
        """ceph-csi's rule: a clone or restore is encrypted exactly when its source is."""
        if found is None:
            return
        if found.encrypted and wanted is None:
            raise InvalidArgument(f"cannot create an unencrypted volume from encrypted {source.kind} "
                                  f"{source.source_id!r}: use a StorageClass with encrypted: \"true\"")
        if wanted is not None and not found.encrypted:
            raise InvalidArgument(f"cannot create an encrypted volume from unencrypted {source.kind} "
                                  f"{source.source_id!r}")

    @contextmanager
    def source_held(self, session: Session, source: ContentSource | None, spec: EncryptionSpec | None,
                    volume_id: str) -> Iterator[None]:
        """An encrypted clone's source volume's rotation lock from the cut to `settle`'s key copy:
        a `rotate-key` between the two would give the clone its source's old header and new
        passphrase (or the reverse). Restores need none: a snapshot's passphrase is its own, and
        no rotation changes it."""
        if spec is None or source is None or source.kind != "volume":
            yield
            return
        entry_id = sources.decode(source.source_id, "source volume")
        with sources.opened(session, entry_id, "source volume") as (_, source_io), \
                rotation_lock.held(source_io, source.source_id, f"clone {volume_id} of {source.source_id}") as held:
            # For `settle`'s key copy, inside this block: it confirms the lock never lapsed.
            self._held[volume_id] = held
            try:
                yield
            finally:
                self._held.pop(volume_id, None)

    def settle(self, session: Session, io: Ioctx, image_name: str, volume_id: str, spec: EncryptionSpec,
               source: ContentSource | None, secrets: Mapping[str, str], tenant: str) -> None:
        """Before CreateVolume answers: the volume's passphrase is kept and its state set."""
        target = ImageRef(io, image_name, volume_id)
        if source is None:
            self.keys.create_key(target, spec, secrets, tenant)
            return
        found = self.source(session, source)
        if found is None:
            raise FailedPrecondition(f"source {source.kind} {source.source_id!r} of encrypted volume {volume_id} "
                                     "is gone, and its passphrase with it")
        source_spec = found.spec or spec
        # The clone's rotation lock (source_held), when its source is a volume: a copy of a
        # passphrase its KMS keeps is made only while that lock never lapsed since the cut.
        held = self._held.get(volume_id)
        entry_id = sources.decode(source.source_id, f"source {source.kind}")
        with sources.opened(session, entry_id, f"source {source.kind}") as (_, source_io):
            last: FailedPrecondition | None = None
            for key_id in found.key_ids:
                try:
                    self.keys.copy_key(ImageRef(source_io, found.image_name, key_id), source_spec, target, spec,
                                       secrets, tenant, confirm=held.confirm if held is not None else None)
                    log.info("encrypted volume keeps its source's passphrase",
                             extra=fields(image=image_name, source=source.source_id))
                    return
                except FailedPrecondition as error:
                    last = error
            assert last is not None
            raise last

    def remove(self, record: Record, volume_id: str, secrets: Mapping[str, str], io: Ioctx | None = None) -> None:
        """After the image is gone: the KMS forgets the volume's passphrase; given the volume's
        pool (`io`), the empty object of its rotation lock goes too (unless someone holds it)."""
        spec = spec_of(record)
        if spec is not None:
            self.keys.remove_key(volume_id, spec, secrets, record.get(OWNER_KEY))
            if io is not None:
                rotation_lock.remove_object(io, volume_id)

