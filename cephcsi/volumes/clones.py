"""CreateVolume with a content source: restore from a snapshot, or clone a volume.

Both make a clone v2 (no data copied on the request path): of the snapshot image's restore
point, or of a temporary `cephcsi-tmp-<uuid>` snapshot cut under the source's lease. Steps:
clone → grow → image id → flatten policy; a retry finishes a clone or removes its debris.
Encrypted clones of a volume are cut under the rotation lock. docs/design/controller.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cephcsi.ceph import image_access, image_metadata, images, layering
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.ceph.errors import ceph_call
from cephcsi.encryption import volume_keys
from cephcsi.encryption.volume_keys import ImageRef
from cephcsi.errors import AlreadyExists, Internal, InvalidArgument, NotFound, OperationInFlight, OutOfRange
from cephcsi.observability.logging import fields
from cephcsi.volumes import failpoints, flatten, sources
from cephcsi.volumes.capacity import fits, round_up
from cephcsi.volumes.journal import Record
from cephcsi.volumes.volume_id import VolumeId

if TYPE_CHECKING:
    from cephcsi.encryption.spec import EncryptionSpec
    from cephcsi.encryption.volume_keys import VolumeKeys
    from cephcsi.volumes.manager import CreateRequest

log = logging.getLogger(__name__)

SOURCE_KEY = "csi.clone.source"
"""Record key of a restored or cloned volume: `snapshot:<id>` or `volume:<id>`."""
KINDS = ("snapshot", "volume")


@dataclass(frozen=True)
class ContentSource:
    kind: str
    """"snapshot" or "volume"."""
    source_id: str

    def encode(self) -> str:
        return f"{self.kind}:{self.source_id}"


def record_values(source: ContentSource | None) -> dict[str, str]:
    return {SOURCE_KEY: source.encode()} if source is not None else {}


def has_source(record: Record) -> bool:
    return bool(record.get(SOURCE_KEY))


@dataclass(frozen=True)
class Parent:
    """What the new image is cloned from."""

    io: Ioctx
    image: str
    snap: str
    size: int
    image_id: str


def target_size(request: CreateRequest, source_size: int) -> int:
    """At least the source's size; larger when asked (the clone is grown); OUT_OF_RANGE when
    the limit is below the source."""
    limit = request.limit_bytes
    if limit and source_size > limit:
        raise OutOfRange(f"capacity_range limit_bytes {limit} is smaller than the source's {source_size} bytes; "
                         "a volume made from a source must be at least as large as it")
    if request.required_bytes <= source_size:
        return source_size
    return max(request.size, round_up(request.required_bytes))


class Cloner:
    def __init__(self, policy: flatten.FlattenPolicy, instance_id: str, lock_seconds: float,
                 keeper: LeaseKeeper) -> None:
        self.policy = policy
        self.keeper = keeper
        self.instance_id = instance_id
        self.lock_seconds = lock_seconds

    def ensure(self, session: Session, io: Ioctx, request: CreateRequest,
               record: Record, keys: VolumeKeys | None = None) -> tuple[str, int, bool]:
        """(image id, size, whether the request's metadata was written) of the volume's image,
        cloning it from the request's source first. `keys`: where an encrypted clone's
        passphrase is kept, to tell an earlier attempt's cut that must be cut again (module
        docstring); without them an earlier cut is always kept."""
        source = request.source
        if source is None or record.get(SOURCE_KEY) != source.encode():
            raise AlreadyExists(f"volume {request.name!r} already exists with content source "
                                f"{record.get(SOURCE_KEY) or 'none'!r}, not {source.encode() if source else 'none'!r}")
        name = record.image_name
        answered = _answered(io, record)
        if answered or layering.finished_clone(session, io, name):
            # An earlier attempt cloned it: finish without the source (it may be gone by now).
            if source.kind != "volume":
                return self._finish(session, io, request, name, target_size(request, _size(io, name)))
            self._drop_temporary(session, source, record)
            if answered or keys is None or not self._untrusted_cut(session, io, request, source, record, keys):
                return self._finish(session, io, request, name, target_size(request, _size(io, name)))
            log.info("clone cut again: its earlier cut's passphrase cannot be known",
                     extra=fields(image=name, source=source.source_id))
            layering.remove_debris(io, name)
        try:
            size, cloned = self._clone(session, io, request, source, record)
        except (NotFound, InvalidArgument):
            self._forget(session, io, record)
            raise
        failpoints.reach("clone.after-clone")
        return self._finish(session, io, request, name, size, cloned)

    def _clone(self, session: Session, io: Ioctx, request: CreateRequest, source: ContentSource,
               record: Record) -> tuple[int, int]:
        """Clone the image from the source; (the size it must then have, the size it was cloned
        with: its parent snapshot's)."""
        entry_id = sources.decode(source.source_id, f"source {source.kind}")
        if entry_id.cluster_id != request.parameters.cluster_id:
            raise InvalidArgument(f"source {source.kind} {source.source_id!r} is in cluster {entry_id.cluster_id!r}; "
                                  f"clones are made within one cluster ({request.parameters.cluster_id!r})")
        with sources.opened(session, entry_id, f"source {source.kind}") as (pool, source_io):
            if source.kind == "volume":
                return self._clone_volume(session, source_io, pool, entry_id, io, request, record)
            parent = self._snapshot_parent(session, source_io, pool, entry_id)
            size = target_size(request, parent.size)
            layering.clone(session, parent.io, parent.image, parent.snap, io, record.image_name, self._features(request),
                           request.parameters.data_pool or None, parent_id=parent.image_id)
            return size, parent.size

    def _untrusted_cut(self, session: Session, io: Ioctx, request: CreateRequest, source: ContentSource,
                       record: Record, keys: VolumeKeys) -> bool:
        """An encrypted clone an earlier attempt cut, with no passphrase kept for it yet, whose key
        copy would read its source's current passphrase (VolumeKeys.copy_reads_source_now)."""
        spec, params = request.parameters.encryption, request.parameters
        if spec is None:
            return False
        target = ImageRef(io, record.image_name, VolumeId(params.cluster_id, io.get_pool_id(), record.uuid).encode())
        if keys.keeps_key(target, spec, request.secrets, params.tenant):
            return False  # copied under that attempt's lock, confirmed unlapsed: the cut's
        source_spec = self._source_spec(session, source, spec)
        if source_spec is None:
            return False  # the source is gone: nothing to cut again from; the key copy says so
        return keys.copy_reads_source_now(source_spec, target, request.secrets, params.tenant)

    def _source_spec(self, session: Session, source: ContentSource, spec: EncryptionSpec) -> EncryptionSpec | None:
        """The encryption the source volume's journal record names (`spec`, the clone's, when it
        names none, as Encryption.settle reads it); None when the source is gone."""
        entry_id = sources.decode(source.source_id, "source volume")
        try:
            with sources.opened(session, entry_id, "source volume") as (_, source_io):
                journal = sources.volume_journal(source_io, self.instance_id, self.lock_seconds, self.keeper, session)
                found = journal.read(entry_id.object_uuid)
        except NotFound:
            return None
        if found is None:
            return None
        return volume_keys.spec_of_record({key: found.get(key)
                                           for key in (volume_keys.RECORD_KMS_KEY, volume_keys.RECORD_TYPE_KEY)}) or spec

    def _forget(self, session: Session, io: Ioctx, record: Record) -> None:
        """The source does not exist and no finished clone of it does: drop clone debris, name
        and record (under the volume's lease) so a later request for the name starts afresh."""
        if _answered(io, record) or layering.finished_clone(session, io, record.image_name):
            return
        layering.remove_debris(io, record.image_name)
        journal = sources.volume_journal(io, self.instance_id, self.lock_seconds, self.keeper)
        journal.release_name(record.name, record.uuid)
        journal.remove_record(record.uuid)

    @staticmethod
    def _features(request: CreateRequest) -> int:
        # A clone needs layering whatever the StorageClass lists.
        return images.feature_mask(request.parameters.features) | images.FEATURE_BITS["layering"]

    def _snapshot_parent(self, session: Session, io: Ioctx, pool: str, entry_id: VolumeId) -> Parent:
        journal = sources.snapshot_journal(io, self.instance_id, self.lock_seconds, self.keeper, session)
        entry = sources.read_entry(io, pool, entry_id, journal, "source snapshot")
        name = entry.record.image_name
        size_text = entry.record.get(sources.FINISHED_SIZE)
        if size_text.isdigit() and entry.record.image_id:
            # A finished snapshot (its restore point exists; a snapshot image is never resized).
            # If the restore point was removed by hand since, the clone fails NOT_FOUND.
            return Parent(io, name, name, int(size_text), entry.record.image_id)

        def read(image: image_access.Image) -> tuple[layering.SnapInfo | None, int, str]:
            return layering.user_snap(image, name), int(image.size()), str(image.id())

        with ceph_call("open snapshot image", f"image {name!r}"):
            found = image_access.if_exists(io, read, name, read_only=True)
        if found is None or found[0] is None:
            raise OperationInFlight(f"snapshot {entry_id.encode()!r} is still being created; retry")
        _, size, image_id = found
        # The restore point's size, not the head's: a snapshot image is never resized, so they agree.
        return Parent(io, name, name, size, image_id)

    def _clone_volume(self, session: Session, source_io: Ioctx, pool: str, entry_id: VolumeId,
                      io: Ioctx, request: CreateRequest, record: Record) -> tuple[int, int]:
        """Clone the source volume at a temporary snapshot, under its lease; (the target size, the
        size cloned: the source's now)."""
        journal = sources.volume_journal(source_io, self.instance_id, self.lock_seconds, self.keeper, session)
        temp = f"{layering.TEMP_SNAP_PREFIX}{record.uuid}"
        with sources.hold_source(journal, entry_id.object_uuid) as source_record, \
                ceph_call("clone source volume", f"image {source_record.image_name!r}"), \
                image_access.open_image(source_io, source_record.image_name) as source:
            cloned = int(source.size())
            size = target_size(request, cloned)
            # An encrypted source's temporary snapshot left by an earlier attempt predates this
            # call's rotation lock (the clone would get its old header with the metadata, and so
            # the passphrase, of now): swept too, and cut again.
            keep = "" if request.parameters.encryption is not None else temp
            sources.sweep_temporaries(source, source_record.image_name, keep=keep)
            flatten.limit_snapshots(session, source, flatten.Placement(
                pool, source_io.get_namespace(), source_record.image_name), self.policy)
            layering.ensure_snap(source, temp)
            failpoints.reach("clone.after-source-snap")
            layering.clone(session, source_io, source_record.image_name, temp, io, record.image_name,
                           self._features(request), request.parameters.data_pool or None,
                           parent_id=str(source.id()))
            layering.remove_snap(source, temp)
        return size, cloned

    def drop_temporary_of(self, session: Session, record: Record) -> None:
        """DeleteVolume of a clone of a volume (its record, before it goes): the temporary
        snapshot a killed CreateVolume left on the source, which no retry will remove now (the
        CO gave up the claim). Without this only the next snapshot or clone of the source, the
        source's own delete, or `cephcsi audit --repair` would."""
        kind, _, source_id = record.get(SOURCE_KEY).partition(":")
        if kind == "volume" and source_id:
            self._drop_temporary(session, ContentSource(kind, source_id), record)

    def _drop_temporary(self, session: Session, source: ContentSource, record: Record) -> None:
        """Remove the clone's temporary snapshot from its source volume if still there. Looked
        for read-only first: it is almost never there, and a read-write open under the source's
        lease would add a watch and a lease to every retry and every delete of a clone."""
        temp = f"{layering.TEMP_SNAP_PREFIX}{record.uuid}"
        try:
            entry_id = sources.decode(source.source_id, "source volume")
            with sources.opened(session, entry_id, "source volume") as (_, source_io):
                journal = sources.volume_journal(source_io, self.instance_id, self.lock_seconds, self.keeper, session)
                found = journal.read(entry_id.object_uuid)
                if found is None:
                    return  # the source is gone; its temporary snapshot went with it
                with ceph_call("look for a temporary snapshot", f"image {found.image_name!r}"):
                    left = image_access.if_exists(source_io, lambda image: layering.user_snap(image, temp) is not None,
                                                  found.image_name, read_only=True)
                if not left:
                    return
                with sources.hold_source(journal, entry_id.object_uuid) as source_record, \
                        ceph_call("remove temporary snapshot", f"image {source_record.image_name!r}"):
                    log.info("removing the temporary snapshot of an interrupted clone",
                             extra=fields(image=source_record.image_name, snapshot=temp))
                    image_access.if_exists(source_io, lambda image: layering.remove_snap(image, temp),
                                           source_record.image_name)
        except NotFound:
            pass  # the source is gone; its temporary snapshot went with it

    def _finish(self, session: Session, io: Ioctx, request: CreateRequest, name: str, size: int,
                cloned: int | None = None) -> tuple[str, int, bool]:
        """Grow the clone to `size` (a retry after a crash before the resize does it), apply the
        flatten policy, and return (image id, size, whether the request's metadata was written).
        `cloned`: the size this call just cloned it with; when that is already `size` (the usual
        restore or clone), nothing needs the image open: its id is one read of `rbd_id.<name>` and
        its depth is read from the headers."""
        if cloned is not None and cloned >= size:
            current = cloned
            image_id = images.lookup_id(io, name) or ""
        else:
            with ceph_call("open cloned image", f"image {name!r}"), image_access.open_image(io, name) as image:
                current = int(image.size())
                if current < size:
                    log.info("growing the clone to the requested size", extra=fields(image=name, bytes=size))
                    image.resize(size)
                    current = size
                image_id = str(image.id())
        if not fits(current, request.required_bytes, request.limit_bytes):
            raise AlreadyExists(f"volume {request.name!r} already exists with {current} bytes, which does not fit "
                                f"the requested range [{request.required_bytes}, {request.limit_bytes or 'unbounded'}]")
        if not image_id:
            raise Internal(f"image {name!r} has no id right after it was cloned; retry")
        written = cloned is not None and bool(request.metadata)
        if written:
            # A clone this call made has no metadata and nobody has it open before the flatten
            # policy may hand it to the mgr: the owner keys go to its header in one class call
            # (image_metadata.set_on_header) instead of a read-only and a read-write open.
            image_metadata.set_on_header(io, name, image_id, request.metadata)
        flatten.after_create(session, io, image_id, flatten.Placement(request.parameters.pool, io.get_namespace(), name),
                             self.policy)
        return image_id, current, written


def _size(io: Ioctx, name: str) -> int:
    with ceph_call("open cloned image", f"image {name!r}"), image_access.open_image(io, name, read_only=True) as image:
        return int(image.size())


def _answered(io: Ioctx, record: Record) -> bool:
    """The record's image is the one a finished CreateVolume journaled (its id goes to the record
    with the lease's release, after the answer's last step). Such a clone is the user's volume
    even when it no longer links to a parent (flattened by the mgr or an admin): without this,
    a repeated CreateVolume, which the CSI contract allows at any time, would take it for the
    debris of a killed clone and clone again over its data."""
    return bool(record.image_id) and images.lookup_id(io, record.image_name) == record.image_id
