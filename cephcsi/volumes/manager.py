"""Create and delete RBD volumes, idempotently and crash-safely, on top of the journal.

This is the controller's storage logic with no gRPC in it; cephcsi.csi.controller translates
requests to these calls, and the embedded provisioner reaches them through that servicer.
Per-name and per-id locks stop two calls in this process from racing; the journal's atomic
reservation stops two processes from doing so.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from contextlib import ExitStack, contextmanager
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from cephcsi.ceph import image_ensure, image_metadata, image_removal, images, omap, trash
from cephcsi.ceph.connection import ConnectionCache, Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.errors import AlreadyExists, CephCSIError, FailedPrecondition, Internal, NotFound, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.observability.logging import fields
from cephcsi.encryption import volume_keys
from cephcsi.encryption.volume_keys import VolumeKeys
from cephcsi.volumes import by_id, clones, failpoints, new_images, placement, split_journal
from cephcsi.volumes.encrypted import OWNER_KEY, Encryption
from cephcsi.volumes.capacity import fits
from cephcsi.volumes.journal import PLANNED_IMAGE_ID, VOLUMES, Claim, Hold, Journal, Record, pending_metadata_values
from cephcsi.volumes.parameters import VolumeParameters
from cephcsi.volumes.topology import Requirements
from cephcsi.volumes.split_journal import JOURNAL_POOL, SplitVolume, parse_name_value
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CreateRequest:
    name: str
    parameters: VolumeParameters
    size: int
    """Bytes to allocate for a new image (already rounded)."""
    required_bytes: int
    limit_bytes: int
    credentials: Credentials
    metadata: Mapping[str, str] = field(default_factory=dict)
    """Image metadata to hold (--extra-create-metadata owner keys, cephcsi.volumes.metadata)."""
    source: clones.ContentSource | None = None
    """Snapshot to restore or volume to clone (cephcsi.volumes.clones)."""
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The call's raw secrets: an encrypted volume's KMS reads its passphrase there."""
    requirements: Requirements | None = None
    """The CO's accessibility requirements (None: it sent none); with the class's
    topologyConstrainedPools they choose the pool (cephcsi.volumes.placement)."""


@dataclass(frozen=True)
class Volume:
    volume_id: VolumeId
    size: int
    image_name: str
    context: dict[str, str]
    topology: dict[str, str] | None = None
    """Segments the volume is accessible from (a topology-constrained pool's); None: everywhere."""


@dataclass(frozen=True)
class Located:
    """A volume found from its id: where it lives and its journal record."""

    volume_id: VolumeId
    pool: str
    record: Record


class VolumeManager:
    def __init__(
        self,
        clusters: ClusterRegistry,
        connections: ConnectionCache,
        instance_id: str,
        journal_lock_seconds: float = 10.0,
        inline_purge_seconds: float = 20.0,
        cloner: clones.Cloner | None = None,
        *,
        keeper: LeaseKeeper,
        keys: VolumeKeys | None = None,
    ) -> None:
        self.clusters = clusters
        self.keeper = keeper
        """The process's journal lease keeper (cephcsi.cli.wiring builds it)."""
        self.connections = connections
        self.instance_id = instance_id
        self.journal_lock_seconds = journal_lock_seconds
        self.name_locks = KeyLocks("volume name")
        self.id_locks = KeyLocks("volume")
        self.inline_purges = trash.InlinePurges(inline_purge_seconds)
        self.cloner = cloner
        """None when snapshots and clones are not enabled."""
        self.encryption = Encryption(keys or VolumeKeys(), instance_id, journal_lock_seconds, keeper)

    def _journal(self, io: Ioctx) -> Journal:
        return Journal(io, self.instance_id, VOLUMES, lock_seconds=self.journal_lock_seconds, keeper=self.keeper)

    def create(self, request: CreateRequest) -> Volume:
        cluster = self.clusters.get(request.parameters.cluster_id)
        with self.name_locks.hold(request.name), self.connections.session(cluster, request.credentials) as session:
            # A class with topologyConstrainedPools: the pool is chosen here, and the volume is an
            # ordinary one of that pool from here on (cephcsi.volumes.placement).
            placed = placement.place(session, request.parameters, request.requirements, request.source,
                                     lambda io: self._journal(io).lookup(request.name) is not None,
                                     lambda pool: self._release_imageless(session, pool, request))
            volume = self._create(session, dataclasses.replace(request, parameters=placed))
            segments = placement.accessible(request.parameters, request.requirements, volume.context["pool"])
            return dataclasses.replace(volume, topology=segments) if segments is not None else volume

    def _release_imageless(self, session: Session, pool: str, request: CreateRequest) -> bool:
        """Undo the reservation of `request.name` in `pool` when no image exists for it (a create
        that failed, e.g. on quota, or was killed before its image), with delete's undo code under
        the entry's journal lease; the caller holds the name lock. True when the name is free in
        `pool` afterwards; False when an image (or anything but our own record) is there."""
        with session.ioctx(pool) as io:
            journal = self._journal(io)
            uuid = self._find_uuid(journal, request.name)  # releases a name without a record
            if uuid is None:
                return True
            if parse_name_value(uuid, f"name key of {request.name!r} in pool {pool!r}").elsewhere(io.get_pool_id()):
                return False  # ceph-csi's split layout: its image lives elsewhere; left alone
            with journal.locked(uuid, read=True) as hold:
                record = hold.found
                current = journal.lookup(request.name)
                if current != uuid:
                    # Changed since _find_uuid (a concurrent delete or audit repair holds the id
                    # lock, not our name lock): an empty record our lock made is nobody's.
                    if record is None:
                        journal.discard_orphan(uuid)
                    if current is None:
                        return True
                    raise OperationInFlight(f"the reservation of {request.name!r} in pool {pool!r} changed "
                                            "while it was checked; the retry looks again")
                if record is None:
                    raise OperationInFlight(f"the journal record of {request.name!r} in pool {pool!r} went away "
                                            "while it was checked; the retry looks again")
                if record.name != request.name or record.get(JOURNAL_POOL):
                    return False
                if record.image_id or images.lookup_id(io, record.image_name) is not None:
                    return False
                volume_id = VolumeId(request.parameters.cluster_id, io.get_pool_id(), uuid).encode()
                log.info("releasing a reservation without an image in a pool the topology no longer matches",
                         extra=fields(name=request.name, uuid=uuid, pool=pool))
                self._delete_locked(session, io, pool, journal, hold, uuid,
                                    lambda found: self.encryption.remove(found, volume_id, request.secrets, io))
                return True

    def _create(self, session: Session, request: CreateRequest) -> Volume:
        params = request.parameters
        cluster = self.clusters.get(params.cluster_id)
        with session.ioctx(params.pool) as io:
            journal = self._journal(io)
            # Refused before anything is reserved: an unknown KMS, or a clone or restore whose
            # encryption differs from its source's (ceph-csi's rule).
            self.encryption.check(params.encryption, request.secrets, params.tenant)
            if request.source is not None:
                found = self.encryption.source(session, request.source,
                                               read_state=params.encryption is not None)
                self.encryption.require_compatible(params.encryption, request.source, found)
            encrypted = volume_keys.record_values(params.encryption)
            if encrypted and params.tenant:
                encrypted[OWNER_KEY] = params.tenant
            # The owner keys of a new image are written after the answer; until then the
            # record keeps them (journal.PENDING_METADATA). Clones get theirs before.
            pending = pending_metadata_values(request.metadata) if request.source is None else {}
            image_metadata.check_settable(request.metadata)
            # Two rounds at most: the first may find the name released by a delete that
            # finished while we waited for its lock.
            for _ in range(2):
                proposed = VolumeId.new_uuid()
                reserving = time.monotonic()
                uuid = journal.reserve(request.name, proposed)
                fresh = uuid == proposed
                if not fresh:
                    value = parse_name_value(uuid, f"name key of {request.name!r} in pool {params.pool!r}")
                    if value.elsewhere(io.get_pool_id()):
                        # ceph-csi made this volume in a topology-constrained pool: adopt it
                        # there, never as a uuid of this pool (its record is not here).
                        return self._adopt_split(session, io, request, uuid, value)
                failpoints.reach("create.after-reserve")
                # A new image of a plain layout is written by hand under an id journaled
                # with the record (cephcsi.ceph.image_ensure); else librbd makes it.
                order = new_images.hand_order(session, io, request) if fresh else None
                planned = {PLANNED_IMAGE_ID: image_ensure.plan_id()} if order is not None else {}
                claim = Claim(request.name, f"{params.name_prefix}{uuid}",
                              {**clones.record_values(request.source), **pending, **planned, **encrypted})
                # A uuid this call just reserved has no record yet: the hold writes it.
                with journal.locked(uuid, claim if fresh else None) as hold, ExitStack() as rotation:
                    # Between the reserve and the lock, another process's find()
                    # (provisioner clean-up) or an audit repair may have taken the
                    # record-less name for a dead create's and released it; going on
                    # would journal a volume no name points at. A record this call filled
                    # soon enough after its reservation cannot have lost its name (see
                    # Journal.reserved_within_window); otherwise the name is read again.
                    if not journal.reserved_within_window(hold, reserving) and journal.lookup(request.name) != uuid:
                        journal.discard_orphan(uuid)
                        continue
                    record = hold.claimed or journal.claim_record(uuid, claim.name, claim.image_name, claim.extra)
                    failpoints.reach("create.after-record")
                    self.encryption.require_same(request.name, record, params.encryption)
                    made = written = False
                    volume_id = VolumeId(params.cluster_id, io.get_pool_id(), uuid)
                    self.encryption.prepare(volume_id.encode(), params.encryption, request.source,
                                            request.secrets, params.tenant)
                    hold.ensure_held()
                    rotation.enter_context(self.encryption.source_held(session, request.source, params.encryption,
                                                                       volume_id.encode()))
                    if self.cloner is not None and (request.source is not None or clones.has_source(record)):
                        image_id, size, written = self.cloner.ensure(session, io, request, record,
                                                                     keys=self.encryption.keys)
                    else:
                        image_id, size, made = new_images.ensure(session, io, request, journal, record, fresh, order)
                    if record.get(PLANNED_IMAGE_ID):
                        hold.forget_on_release(PLANNED_IMAGE_ID)
                    if params.encryption is not None:
                        # Before the answer, after the image: a crash between the two leaves
                        # an image without a passphrase, which the retry gives one (never a
                        # second: create_key keeps one already kept).
                        hold.ensure_held()
                        self.encryption.settle(session, io, record.image_name, volume_id.encode(),
                                               params.encryption, request.source, request.secrets,
                                               params.tenant)
                        failpoints.reach("create.after-key")
                    # A new image's id ('' when librbd chose it: read then) is journaled
                    # behind the answer.
                    if made and request.metadata and record.pending_metadata() == dict(request.metadata):
                        # A new image, and its owner keys are durable in the record: they go
                        # to its header after the answer, with its id journaled and the
                        # lease released (a crash first leaves the keys in the record, for a
                        # retry or `cephcsi audit --repair`, the id unjournaled, which a retry
                        # and every delete handle, and the lease to lapse).
                        hold.journal_image_id_behind(record.image_name, image_id, metadata=request.metadata)
                    else:
                        self._settle_metadata(io, hold, record, {} if written else request.metadata, made,
                                              image_id)
                        if record.image_id != image_id and not made:
                            # Journaled with the lease's release (Hold.set_image_id_on_release).
                            hold.set_image_id_on_release(image_id)
                    return Volume(
                        volume_id=volume_id,
                        size=size,
                        image_name=record.image_name,
                        context=params.volume_context(record.image_name, cluster.rados_namespace),
                    )
            raise OperationInFlight(f"volume {request.name!r} is being deleted concurrently; retry")

    @staticmethod
    def _settle_metadata(io: Ioctx, hold: Hold, record: Record, metadata: Mapping[str, str], made: bool,
                         known_id: str) -> None:
        """Before the answer: the metadata this request asks for, and what an earlier attempt's
        record still keeps pending, onto the image; the pending keys leave the record with the
        release. A new image's id ('' when not known yet) is journaled behind the answer."""
        wanted = {**record.pending_metadata(), **metadata}
        if made and wanted:
            # Nobody can have the new image open yet: its keys go to its header in one class
            # call instead of through an image open.
            if known_id:
                image_metadata.set_on_header(io, record.image_name, known_id, wanted)
            else:
                known_id = image_metadata.set_on_new(io, record.image_name, wanted)
        else:
            # A new image has no metadata to read first.
            image_metadata.ensure(io, record.image_name, wanted, known_empty=made)
        hold.forget_pending_metadata_on_release(record)
        if made:
            hold.journal_image_id_behind(record.image_name, known_id)

    def _adopt_split(self, session: Session, io: Ioctx, request: CreateRequest, raw: str,
                     value: split_journal.NameValue) -> Volume:
        """A retried CreateVolume of a volume ceph-csi journaled here but created in another pool
        (split_journal). Nothing is created: the volume exists or the call fails, naming why."""
        params = request.parameters
        assert value.image_pool_id is not None
        image_pool = session.pool_name(value.image_pool_id)
        if image_pool is None:
            raise FailedPrecondition(
                f"volume {request.name!r} was created by ceph-csi in pool id {value.image_pool_id}, which no longer "
                f"exists; its name key in pool {params.pool!r} is stale: `cephcsi audit --repair` releases it"
            )
        with session.ioctx(image_pool) as image_io:
            journal = self._journal(image_io)
            uuid = value.uuid
            # The same lock DeleteVolume takes (on the record object in the volume id's pool):
            # an adoption never answers for a volume a delete is taking apart.
            with journal.locked(uuid):
                if self._journal(io).lookup(request.name) != raw:
                    raise OperationInFlight(f"volume {request.name!r} changed while it was being adopted; retry")
                split = split_journal.locate(session, image_io, image_pool, VOLUMES, uuid, journal_pool=params.pool)
                if split is None:
                    if journal.read(uuid) is None and omap.read(image_io, f"{VOLUMES.record_prefix}{uuid}") == {}:
                        journal.discard_orphan(uuid)  # our lock made it; nothing else is in it
                    raise FailedPrecondition(
                        f"volume {request.name!r}: its name key in pool {params.pool!r} points at {raw!r}, but neither "
                        f"pool {params.pool!r} nor {image_pool!r} holds its journal record; `cephcsi audit --repair` "
                        "releases the key once nothing of the volume is left"
                    )
                record = split.record
                if record.name != request.name:
                    raise Internal(
                        f"journal record {record.uuid} in pool {split.record_pool!r} belongs to {record.name!r}, not "
                        f"{request.name!r}; the journal is inconsistent: run `cephcsi audit` before retrying"
                    )
                info = images.stat(image_io, record.image_name)
                if info is None:
                    raise FailedPrecondition(
                        f"volume {request.name!r} (image {record.image_name!r} in pool {image_pool!r}, made by "
                        "ceph-csi) has no image; run `cephcsi audit`"
                    )
                if not fits(info.size, request.required_bytes, request.limit_bytes):
                    raise AlreadyExists(
                        f"volume {request.name!r} already exists with {info.size} bytes, which does not fit the "
                        f"requested range [{request.required_bytes}, {request.limit_bytes or 'unbounded'}]"
                    )
                image_metadata.ensure(image_io, record.image_name, request.metadata)
                cluster = self.clusters.get(params.cluster_id)
                context = params.volume_context(record.image_name, cluster.rados_namespace)
                context["pool"] = image_pool  # where the node finds the image (ceph-csi's context says so too)
                return Volume(VolumeId(params.cluster_id, value.image_pool_id, uuid), info.size,
                              record.image_name, context)

    def delete(self, volume_id_text: str, secrets: Mapping[str, str]) -> None:
        """Delete the volume; a volume (or pool) that is already gone counts as deleted.

        Takes the raw secrets: an id this driver never issued is deleted (a no-op) even
        without credentials, as the CSI spec asks."""
        try:
            volume_id = VolumeId.decode(volume_id_text)
        except MalformedId as error:
            log.info("delete of an id this driver never issued; nothing to do", extra=fields(volume_id=volume_id_text, why=str(error)))
            return
        credentials = Credentials.from_secrets(secrets)
        cluster = self.clusters.get(volume_id.cluster_id)
        with self.id_locks.hold(volume_id_text), self.connections.session(cluster, credentials) as session:
            pool = session.pool_name(volume_id.pool_id)
            if pool is None:
                log.info("pool of the volume is gone; nothing to delete", extra=fields(volume_id=volume_id_text))
                return
            with session.ioctx(pool) as io:
                journal = self._journal(io)
                # Locked even when no record is visible: a create that was killed right after
                # locking leaves an empty record object, which this removes.
                with journal.locked(volume_id.object_uuid, read=True) as hold:
                    self._delete_locked(session, io, pool, journal, hold, volume_id.object_uuid,
                                        lambda record: self.encryption.remove(record, volume_id_text, secrets, io))
                log.info("volume deleted", extra=fields(volume_id=volume_id_text))

    def _delete_locked(self, session: Session, io: Ioctx, pool: str, journal: Journal, hold: Hold,
                       uuid: str, forget_key: Callable[[Record], None] = lambda record: None) -> None:
        """Image first, then the name, then the record: a record is removed only once its
        image is gone or queued with the mgr, so a retry after any crash still finds it."""
        record = hold.found
        if record is None or record.get(JOURNAL_POOL):
            # No name here, or a name key in another pool: a volume ceph-csi journaled apart
            # from its image (split_journal), or (no name) a create killed right after locking.
            split = split_journal.locate(session, io, pool, VOLUMES, uuid)
            if split is not None:
                self._delete_split(session, io, pool, journal, hold, split)
                return
        if record is None:
            default_image = f"{VOLUMES.default_image_prefix}{uuid}"
            if images.lookup_id(io, default_image) is not None:
                # Never ours (cephcsi writes the record before the image) and never "already
                # deleted": the record that names it was not found in any pool we can read.
                raise FailedPrecondition(
                    f"volume {uuid} has no journal record in any readable pool, but image {default_image!r} exists "
                    f"in pool {pool!r}; nothing was deleted: run `cephcsi audit`"
                )
            log.info("no journal record; volume already deleted", extra=fields(uuid=uuid))
            journal.discard_orphan(uuid)
            return
        hold.ensure_held()
        if self.cloner is not None and clones.has_source(record):
            # A clone killed after its temporary snapshot on the source, then given up by the CO.
            # Best effort: the source may sit in another pool that is unreachable, unreadable with
            # these credentials, or busy, and none of that may block deleting the clone itself;
            # `cephcsi audit` reports (and repairs) a temporary snapshot left behind.
            try:
                self.cloner.drop_temporary_of(session, record)
            except CephCSIError as error:
                log.warning("could not look for the clone's temporary snapshot on its source; deleting the clone "
                            "anyway (cephcsi audit reports a leftover)",
                            extra=fields(volume=record.name, image=record.image_name, error=error.message))
        self._remove_image(session, io, pool, journal, record)
        failpoints.reach("delete.after-image")
        # A KMS that keeps the passphrase forgets it once the image is out of service, before the
        # record that names the KMS goes: a failure here is retried by the next DeleteVolume.
        forget_key(record)
        hold.ensure_held()  # a lapsed lease may have let a create adopt the name meanwhile
        journal.release_name(record.name, record.uuid)
        failpoints.reach("delete.after-release")
        journal.remove_record(record.uuid)

    def _delete_split(self, session: Session, io: Ioctx, pool: str, journal: Journal, hold: Hold,
                      split: SplitVolume) -> None:
        """The order of `_delete_locked` across two pools: image (in `pool`), then the name key
        (in the journal pool, only while it still points here), then the record wherever its
        values are, and last the object in `pool` the lock lives on. A retry after a crash at
        any step finds the record (or, after the last, nothing) and goes on from there.
        `journal` is the image pool's journal of the entry's kind (volumes, or snapshots for
        SnapshotManager); the journal pool's is made the same way."""
        record = split.record
        with session.ioctx(split.journal_pool, io.get_namespace()) as journal_io:
            names = Journal(journal_io, journal.instance_id, journal.kind, lock_seconds=journal.lock_seconds,
                            keeper=journal.keeper)
            values = names if split.record_in_journal_pool else journal
            hold.ensure_held()
            self._remove_image(session, io, pool, values, record)
            failpoints.reach("delete.after-image")
            hold.ensure_held()
            names.release_name(record.name, split.name_value)
            failpoints.reach("delete.after-release")
            if split.record_in_journal_pool:
                names.remove_record(record.uuid)
            journal.remove_record(record.uuid)
        log.info("deleted an entry journaled in another pool (ceph-csi topology)",
                 extra=fields(journal=journal.kind.record_prefix, uuid=record.uuid, image=record.image_name,
                              journal_pool=split.journal_pool))

    def _remove_image(self, session: Session, io: Ioctx, pool: str, journal: Journal, record: Record) -> None:
        """Take the image out of service (cephcsi.ceph.image_removal), journaling its id as soon
        as it is known and before anything moves it."""
        image_removal.take_out(
            session, io, pool,
            image_removal.Target(record.image_name, record.image_id, record.unjournaled_planned_id),
            image_removal.Steps(journal_id=lambda image_id: journal.set_image_id(record.uuid, image_id),
                                after_trash=lambda: failpoints.reach("delete.after-trash")),
            self.inline_purges)

    def find(self, name: str, parameters: VolumeParameters, credentials: Credentials) -> str | None:
        """The id of the volume journaled under request `name` in the parameters' pool (or, for
        a class with topologyConstrainedPools, in any of its pools), or None.

        Creates nothing (CreateVolume would create a missing volume); it only releases a name a
        create reserved and died before recording, which nothing else would ever release. The
        provisioner uses it to clean up a volume whose claim was deleted before its PV existed. A
        missing pool means no volume."""
        cluster = self.clusters.get(parameters.cluster_id)
        pools = dict.fromkeys([parameters.pool, *(p.pool for p in parameters.topology_pools)])
        with self.name_locks.hold(name), self.connections.session(cluster, credentials) as session:
            for pool in pools:
                try:
                    with session.ioctx(pool) as io:
                        pool_id = io.get_pool_id()
                        raw = self._find_uuid(self._journal(io), name)
                except NotFound:
                    continue
                if raw:
                    value = parse_name_value(raw, f"name key of {name!r} in pool {pool!r}")
                    if value.elsewhere(pool_id):
                        assert value.image_pool_id is not None
                        pool_id = value.image_pool_id
                    return VolumeId(parameters.cluster_id, pool_id, value.uuid).encode()
        return None

    @staticmethod
    def _find_uuid(journal: Journal, name: str) -> str | None:
        """The name key's value; a name reserved by a create that died before writing the record
        is released here (nothing else will ever name it), and None returned. A value pointing
        into another pool (split_journal) is returned as it is: its record is not in this pool,
        so not finding it here says nothing."""
        uuid = journal.lookup(name)
        if uuid is None:
            return None
        if parse_name_value(uuid, f"name key of {name!r}").elsewhere(journal.io.get_pool_id()):
            return uuid
        if journal.read(uuid) is not None:
            return uuid
        with journal.locked(uuid) as hold:
            if journal.lookup(name) == uuid and journal.read(uuid) is None:
                log.info("releasing a name whose create never wrote a record", extra=fields(name=name, uuid=uuid))
                journal.release_unrecorded(name, uuid, hold)
                return None
        return journal.lookup(name)

    def locate(self, volume_id_text: str, credentials: Credentials) -> tuple[Located, images.ImageInfo]:
        """The volume and its image, or NotFound (also for ids this driver never issued)."""
        volume_id = by_id.decode(volume_id_text, "volume")
        with by_id.opened(self.clusters, self.connections, volume_id, f"volume {volume_id_text!r}", credentials) as at:
            record = self.read_record(at.session, at.io, at.pool, volume_id.object_uuid)
            info = images.stat(at.io, record.image_name) if record else None
            if record is None or info is None:
                raise NotFound(f"volume {volume_id_text!r} does not exist")
            return Located(volume_id, at.pool, record), info

    @contextmanager
    def held(self, volume_id_text: str, credentials: Credentials) -> Iterator[tuple[Ioctx, Record]]:
        """The pool handle and record of an existing volume, under the volume's in-process lock:
        for a call that changes one volume in place (modify, sparsify). NotFound as `locate`."""
        volume_id = by_id.decode(volume_id_text, "volume")
        with by_id.opened(self.clusters, self.connections, volume_id, f"volume {volume_id_text!r}", credentials,
                          self.id_locks, volume_id_text) as at:
            record = self.read_record(at.session, at.io, at.pool, volume_id.object_uuid)
            if record is None:
                raise NotFound(f"volume {volume_id_text!r} does not exist")
            yield at.io, record

    def read_record(self, session: Session, io: Ioctx, pool: str, uuid: str) -> Record | None:
        """The volume's record: in its own pool, or where ceph-csi put it for a volume it
        journaled in another pool (split_journal). None when neither has one. Read only."""
        record = self._journal(io).read(uuid)
        if record is not None and not record.get(JOURNAL_POOL):
            return record
        split = split_journal.locate(session, io, pool, VOLUMES, uuid)
        return split.record if split is not None else record
