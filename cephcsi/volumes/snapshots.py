"""CSI snapshots on RBD, idempotent by name and crash-safe, through the snapshot journal: one
snapshot is one snapshot image `csi-snap-<uuid>` (ceph-csi's layout) carrying the restore point.
DeleteSnapshot undoes any prefix of CreateSnapshot's steps. Design: docs/design/controller.md.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

from cephcsi.ceph import image_access, images, layering, rotation_lock
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import AlreadyExists, CephCSIError, FailedPrecondition, InvalidArgument, NotFound, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.observability.logging import fields
from cephcsi.encryption.volume_keys import ImageRef
from cephcsi.volumes import encrypted, failpoints, flatten, sources, split_journal
from cephcsi.volumes.journal import IMAGE_ID, SNAPSHOTS, SOURCE, Journal, Record
from cephcsi.volumes.manager import VolumeManager
from cephcsi.volumes.split_journal import JOURNAL_POOL, parse_name_value
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)

SOURCE_VOLUME_ID = "csi.source.volumeid"
"""The source volume's CSI id (csi.source holds its image name, as in ceph-csi)."""
CREATED = "csi.snap.creationtime"
"""Epoch seconds of the temporary snapshot on the source: the instant the data is from."""
DEFAULT_PREFIX = "csi-snap-"
KNOWN_KEYS = ("clusterID", "pool", "snapshotNamePrefix")
KUBERNETES_PREFIX = "csi.storage.k8s.io/"


@dataclass(frozen=True)
class SnapshotParameters:
    """VolumeSnapshotClass parameters (ceph-csi's names). The snapshot lives in the source's
    pool and cluster; `clusterID`/`pool`, when given, must name those."""

    cluster_id: str = ""
    pool: str = ""
    name_prefix: str = DEFAULT_PREFIX

    @classmethod
    def parse(cls, parameters: Mapping[str, str]) -> SnapshotParameters:
        unknown = sorted(k for k in parameters if k not in KNOWN_KEYS and not k.startswith(KUBERNETES_PREFIX))
        if unknown:
            raise InvalidArgument(f"unknown snapshot parameter(s) {', '.join(unknown)}; supported: {', '.join(KNOWN_KEYS)}")
        prefix = parameters.get("snapshotNamePrefix", DEFAULT_PREFIX)
        if not prefix or len(prefix) > 64 or not all(c.isalnum() or c in "._-" for c in prefix):
            raise InvalidArgument(f"parameter snapshotNamePrefix={prefix!r} must be 1-64 letters, digits, '.', '_' or '-'")
        return cls(parameters.get("clusterID", ""), parameters.get("pool", ""), prefix)


@dataclass(frozen=True)
class SnapshotRequest:
    name: str
    source_volume_id: str
    parameters: SnapshotParameters
    credentials: Credentials
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The call's raw secrets: the snapshot of an encrypted volume re-keeps its passphrase."""


@dataclass(frozen=True)
class Snapshot:
    snapshot_id: str
    source_volume_id: str
    size: int
    creation_time: float
    ready: bool


class SnapshotManager:
    def __init__(self, volumes: VolumeManager, policy: flatten.FlattenPolicy) -> None:
        self.volumes = volumes
        self.policy = policy
        self.name_locks = KeyLocks("snapshot name")
        self.id_locks = KeyLocks("snapshot")

    def _journals(self, io: Ioctx, session: Session) -> tuple[Journal, Journal]:
        """(volume journal, reading source volumes wherever their record is; snapshot journal) of one pool."""
        v = self.volumes
        return (sources.volume_journal(io, v.instance_id, v.journal_lock_seconds, v.keeper, session),
                sources.snapshot_journal(io, v.instance_id, v.journal_lock_seconds, v.keeper))

    # ---- CreateSnapshot -------------------------------------------------------------------------

    def create(self, request: SnapshotRequest) -> Snapshot:
        source_id = sources.decode(request.source_volume_id, "source volume")
        params = request.parameters
        if params.cluster_id and params.cluster_id != source_id.cluster_id:
            raise InvalidArgument(f"parameter clusterID={params.cluster_id!r} differs from the source volume's "
                                  f"cluster {source_id.cluster_id!r}; snapshots are kept in their source's cluster")
        cluster = self.volumes.clusters.get(source_id.cluster_id)
        with self.name_locks.hold(request.name), \
                self.volumes.connections.session(cluster, request.credentials) as session, \
                sources.opened(session, source_id, "source volume") as (pool, io):
            if params.pool and params.pool != pool:
                raise InvalidArgument(f"parameter pool={params.pool!r} differs from the source volume's pool "
                                      f"{pool!r}; snapshots are kept in their source's pool")
            volumes, snapshots = self._journals(io, session)
            for _ in range(2):
                uuid = snapshots.reserve(request.name, VolumeId.new_uuid())
                failpoints.reach("snapshot.after-reserve")
                if parse_name_value(uuid, f"snapshot name key of {request.name!r} in pool {pool!r}").elsewhere(
                        io.get_pool_id()):
                    # ceph-csi's snapshot journal takes the same <pool id>/<uuid> form when the
                    # source's journal pool differs from its pool; that snapshot lives elsewhere.
                    raise FailedPrecondition(
                        f"snapshot {request.name!r} was journaled by ceph-csi in pool {pool!r} for a snapshot in "
                        f"another pool ({uuid!r}); cephcsi does not serve such snapshots"
                    )
                with snapshots.locked(uuid):
                    if snapshots.lookup(request.name) != uuid:
                        snapshots.discard_orphan(uuid)
                        continue
                    record = self._claim(volumes, snapshots, uuid, request, source_id)
                    failpoints.reach("snapshot.after-record")
                    return self._complete(session, io, pool, volumes, snapshots, record, request.secrets)
            raise OperationInFlight(f"snapshot {request.name!r} is being deleted concurrently; retry")

    @staticmethod
    def _claim(volumes: Journal, snapshots: Journal, uuid: str, request: SnapshotRequest,
               source_id: VolumeId) -> Record:
        record = snapshots.read(uuid)
        if record is None:
            source = volumes.read(source_id.object_uuid)
            if source is None:
                # Nothing was cut: release the name so no key is left pointing at nothing.
                snapshots.release_name(request.name, uuid)
                snapshots.discard_orphan(uuid)
                raise NotFound(f"source volume {request.source_volume_id!r} does not exist")
            # An encrypted source's KMS goes to the snapshot's record too, as ceph-csi journals it.
            record = snapshots.claim_record(uuid, request.name, f"{request.parameters.name_prefix}{uuid}", {
                SOURCE: source.image_name, SOURCE_VOLUME_ID: request.source_volume_id,
                **encrypted.record_values_of(source)})
        if record.get(SOURCE_VOLUME_ID) != request.source_volume_id:
            raise AlreadyExists(f"snapshot {request.name!r} already exists for source volume "
                                f"{record.get(SOURCE_VOLUME_ID)!r}, not {request.source_volume_id!r}")
        return record

    def _complete(self, session: Session, io: Ioctx, pool: str, volumes: Journal, snapshots: Journal,
                  record: Record, secrets: Mapping[str, str] = {}) -> Snapshot:
        name = record.image_name
        shape = self._restore_point(io, name)
        if shape is None:
            self._check_key(io, snapshots, record, secrets)
            with self._rotations_held(io, record) as rotations:
                try:
                    fresh = self._cut(session, io, pool, volumes, snapshots, record)
                    if not fresh and self._untrusted_cut(io, record, secrets):
                        # An earlier attempt's cut, made under a lock that lapsed when that
                        # controller died: a rotation may have changed the source's passphrase
                        # since, and its KMS keeps only the current one. The snapshot image holds
                        # no data of its own yet (no snapshot id was ever answered): cut again.
                        log.info("snapshot cut again: its earlier cut's passphrase cannot be known",
                                 extra=fields(image=record.image_name, source=record.get(SOURCE_VOLUME_ID)))
                        layering.remove_debris(io, record.image_name)
                        self._cut(session, io, pool, volumes, snapshots, record, recut=True)
                except NotFound:
                    self._forget(session, io, snapshots, record)
                    raise
                self._rekey(io, record, secrets, rotations)
            with ceph_call("snapshot the snapshot image", f"image {name!r}"), image_access.open_image(io, name) as image:
                # The restore point: restores clone from it; ceph-csi names it like the image.
                layering.ensure_snap(image, name)
                shape = _Shape.of(image)  # what the answer needs, from this open instead of another
            failpoints.reach("snapshot.after-restore-point")
        record = snapshots.read(record.uuid) or record
        return self._describe(session, io, pool, snapshots, record, shape, queue=True)

    def _check_key(self, io: Ioctx, snapshots: Journal, record: Record, secrets: Mapping[str, str]) -> None:
        """Before the cut: the call can build the source's KMS (its passphrase or Secret is there).
        A refusal after the cut would leave a clone of the source that no DeleteSnapshot names
        (the CO has no snapshot id) and that keeps the deleted source in the trash; refused
        before it, with nothing cut, the name and record are released too."""
        spec = encrypted.spec_of(record)
        if spec is None:
            return
        try:
            self.volumes.encryption.check(spec, secrets, record.get(encrypted.OWNER_KEY))
        except CephCSIError:
            if images.lookup_id(io, record.image_name) is None:
                snapshots.release_name(record.name, record.uuid)
                snapshots.remove_record(record.uuid)
            raise

    @staticmethod
    def _rotations_held(io: Ioctx, record: Record) -> AbstractContextManager[rotation_lock.Held | None]:
        """An encrypted source's rotation lock from the cut to the key copy: a `rotate-key`
        between the two would give the snapshot a header its passphrase does not open."""
        if encrypted.spec_of(record) is None:
            return nullcontext()
        return rotation_lock.held(io, record.get(SOURCE_VOLUME_ID), f"snapshot {record.uuid} of "
                                  f"{record.get(SOURCE_VOLUME_ID)}")

    def _untrusted_cut(self, io: Ioctx, record: Record, secrets: Mapping[str, str]) -> bool:
        """An encrypted snapshot image an earlier attempt cut, without its passphrase yet, whose
        source's KMS keeps passphrases itself: its key copy would read the source's current
        passphrase, which a rotation after that attempt's lock lapsed may have replaced. (A KMS
        keeping the wrapped passphrase in the image needs no re-cut: the clone carries the cut's,
        unless the source keeps it under ceph-csi's older key, which librbd does not copy.)"""
        spec = encrypted.spec_of(record)
        if spec is None:
            return False
        keys, tenant = self.volumes.encryption.keys, record.get(encrypted.OWNER_KEY)
        target = ImageRef(io, record.image_name, self._snapshot_id(io, record))
        return not keys.keeps_key(target, spec, secrets, tenant) and \
            keys.copy_reads_source_now(spec, target, secrets, tenant)

    @staticmethod
    def _snapshot_id(io: Ioctx, record: Record) -> str:
        return VolumeId(sources.decode(record.get(SOURCE_VOLUME_ID), "source volume").cluster_id, io.get_pool_id(),
                        record.uuid).encode()

    def _rekey(self, io: Ioctx, record: Record, secrets: Mapping[str, str],
               rotations: rotation_lock.Held | None = None) -> None:
        """An encrypted source's snapshot image carries the source's wrapped passphrase (librbd's
        clone copies metadata); ceph-csi keeps it for the snapshot's own id (copyEncryptionConfig),
        and restores, its own or ours, read it there. Before the restore point: a snapshot whose
        restore point exists has its passphrase, and a retry before that re-keeps it."""
        spec = encrypted.spec_of(record)
        if spec is None:
            return
        source_id = record.get(SOURCE_VOLUME_ID)
        self.volumes.encryption.keys.copy_key(ImageRef(io, record.get(SOURCE), source_id), spec,
                                              ImageRef(io, record.image_name, self._snapshot_id(io, record)), spec,
                                              secrets, record.get(encrypted.OWNER_KEY),
                                              confirm=rotations.confirm if rotations is not None else None)
        failpoints.reach("snapshot.after-key")

    @staticmethod
    def _forget(session: Session, io: Ioctx, snapshots: Journal, record: Record) -> None:
        """The source is gone and no finished clone of it exists: drop the clone debris and the
        entry (under its lease), so nothing is left that no DeleteSnapshot would ever name."""
        if layering.finished_clone(session, io, record.image_name):
            return
        layering.remove_debris(io, record.image_name)
        snapshots.release_name(record.name, record.uuid)
        snapshots.remove_record(record.uuid)

    @staticmethod
    def _restore_point(io: Ioctx, name: str) -> _Shape | None:
        """The snapshot image's size and id once its restore point exists (the snapshot is
        finished), else None."""
        if images.lookup_id(io, name) is None:
            return None  # no image yet (the usual case on a first call): one read, not an open

        def shape(image: image_access.Image) -> _Shape | None:
            restore_point = layering.user_snap(image, name)
            if restore_point is None:
                return None
            return replace(_Shape.of(image), cut_at=layering.snap_timestamp(image, restore_point.snap_id))

        with ceph_call("open snapshot image", f"image {name!r}"):
            return image_access.if_exists(io, shape, name, read_only=True)

    def _cut(self, session: Session, io: Ioctx, pool: str, volumes: Journal, snapshots: Journal,
             record: Record, recut: bool = False) -> bool:
        """Clone the source at a new temporary snapshot, under the source's lease. False when an
        earlier attempt's clone was found complete (nothing cut now). `recut`: the earlier cut
        was dropped, and its creation time goes with it."""
        source_uuid = sources.decode(record.get(SOURCE_VOLUME_ID), "source volume").object_uuid
        if layering.clone_complete(io, record.image_name, None, io):
            # Killed after the clone: finish without needing the source (it may be gone now).
            self._drop_temporary(volumes, record)
            return False
        temp = f"{layering.TEMP_SNAP_PREFIX}{record.uuid}"
        encrypted_source = encrypted.spec_of(record) is not None
        with sources.hold_source(volumes, source_uuid) as source_record, \
                ceph_call("snapshot source volume", f"image {source_record.image_name!r}"), \
                image_access.open_image(io, source_record.image_name) as source:
            # An encrypted source's temporary snapshot left by an earlier attempt predates this
            # call's rotation lock: a rotation since would give the clone the old header with the
            # new wrapped passphrase (librbd copies the metadata as it is at the clone). Swept too.
            sources.sweep_temporaries(source, source_record.image_name, keep="" if encrypted_source else temp)
            flatten.limit_snapshots(session, source, flatten.Placement(pool, io.get_namespace(),
                                                                       source_record.image_name), self.policy)
            cut = layering.ensure_snap(source, temp)
            failpoints.reach("snapshot.after-source-snap")
            if recut or encrypted_source or not record.get(CREATED):
                snapshots.update(record.uuid, {CREATED: f"{layering.snap_timestamp(source, cut.snap_id):.6f}"})
            # deep-flatten: a background flatten must also free the restore point from the source.
            features = source.features() | images.FEATURE_BITS["layering"] | images.FEATURE_BITS["deep-flatten"]
            layering.clone(session, io, source_record.image_name, temp, io, record.image_name, features,
                           _data_pool(session, source, io), parent_id=str(source.id()))
            failpoints.reach("snapshot.after-clone")
            layering.remove_snap(source, temp)
        return True

    @staticmethod
    def _drop_temporary(volumes: Journal, record: Record) -> None:
        """Remove this snapshot's temporary snapshot from its source if a killed cut left it.
        Looked for read-only first: it is almost never there, and a read-write open would add a
        watch (and a lease) to every call."""
        temp = f"{layering.TEMP_SNAP_PREFIX}{record.uuid}"
        source_id, source_image = record.get(SOURCE_VOLUME_ID), record.get(SOURCE)
        if not source_id or not source_image:
            return  # made by ceph-csi, which leaves no temporary snapshot of ours
        with ceph_call("look for a temporary snapshot", f"image {source_image!r}"):
            left = image_access.if_exists(volumes.io, lambda image: layering.user_snap(image, temp) is not None,
                                          source_image, read_only=True)
        if not left:
            return
        try:
            with sources.hold_source(volumes, sources.decode(source_id, "source volume").object_uuid) as source_record, \
                    ceph_call("remove temporary snapshot", f"image {source_record.image_name!r}"):
                image_access.if_exists(volumes.io, lambda source: layering.remove_snap(source, temp),
                                       source_record.image_name)
        except NotFound:
            pass  # the source is gone, and its temporary snapshot went with it (or to the trash)

    def _describe(self, session: Session, io: Ioctx, pool: str, snapshots: Journal | None, record: Record,
                  shape: _Shape, queue: bool) -> Snapshot:
        """The snapshot as CSI reports it; with `queue`, apply the flatten policy to it.
        `snapshots`: the journal holding `record`, where a missing image id is filled in; None
        for a record in another pool (ceph-csi's split layout), which is left as it is."""
        if queue:
            assert snapshots is not None  # CreateSnapshot writes only its own records
            placement = flatten.Placement(pool, io.get_namespace(), record.image_name)
            chain = flatten.after_create(session, io, shape.image_id, placement, self.policy)
            # CreateSnapshot, under the snapshot's lease: what lets a restore skip opening the image.
            if record.image_id != shape.image_id or record.get(sources.FINISHED_SIZE) != str(shape.size):
                snapshots.update(record.uuid, {IMAGE_ID: shape.image_id, sources.FINISHED_SIZE: str(shape.size)})
        else:
            chain = layering.depth(session, io, shape.image_id)
            if not record.image_id and snapshots is not None:
                snapshots.set_image_id(record.uuid, shape.image_id)
        # ceph-csi journals no creation time: its snapshot answers with the restore point's.
        created = float(record.get(CREATED) or shape.cut_at or time.time())
        source_volume_id = record.get(SOURCE_VOLUME_ID) or _source_of_ceph_csi_snapshot(session, io, record)
        snapshot_id = VolumeId(sources.decode(source_volume_id, "source volume").cluster_id,
                               io.get_pool_id(), record.uuid).encode()
        return Snapshot(snapshot_id, source_volume_id, shape.size, created, chain <= self.policy.hard_depth)

    # ---- DeleteSnapshot ---------------------------------------------------------------------------

    def delete(self, snapshot_id_text: str, secrets: Mapping[str, str]) -> None:
        """Delete the snapshot; one already gone (or an id never issued) counts as deleted.
        Volumes restored from it keep reading it: its image waits in the trash until they go."""
        try:
            snapshot_id = VolumeId.decode(snapshot_id_text)
        except MalformedId:
            log.info("delete of a snapshot id this driver never issued; nothing to do", extra=fields(snapshot_id=snapshot_id_text))
            return
        cluster = self.volumes.clusters.get(snapshot_id.cluster_id)
        with self.id_locks.hold(snapshot_id_text), \
                self.volumes.connections.session(cluster, Credentials.from_secrets(secrets)) as session:
            pool = session.pool_name(snapshot_id.pool_id)
            if pool is None:
                return
            with session.ioctx(pool) as io:
                volumes, snapshots = self._journals(io, session)
                with snapshots.locked(snapshot_id.object_uuid) as hold:
                    record = snapshots.read(snapshot_id.object_uuid)
                    if record is None or record.get(JOURNAL_POOL):
                        # ceph-csi journals a snapshot of a topology-constrained volume the way
                        # it journals that volume: name key and record in the StorageClass pool.
                        # Discarding the object here as an orphan would leave its image behind.
                        split = split_journal.locate(session, io, pool, SNAPSHOTS, snapshot_id.object_uuid)
                        if split is not None:
                            self.volumes._delete_split(session, io, pool, snapshots, hold, split)
                            return
                    if record is None:
                        snapshots.discard_orphan(snapshot_id.object_uuid)
                        return
                    self._drop_temporary(volumes, record)
                    # The same removal as a volume's: trash + mgr purge, or deferred to librbd
                    # while restored volumes still read through the image.
                    self.volumes._remove_image(session, io, pool, snapshots, record)
                    failpoints.reach("snapshot.delete.after-image")
                    # The passphrase _rekey kept for the snapshot's own id (a KMS that keeps
                    # keys, such as vault); while the record lasts a retry still knows its KMS.
                    self.volumes.encryption.remove(record, snapshot_id_text, secrets)
                    snapshots.release_name(record.name, record.uuid)
                    snapshots.remove_record(record.uuid)
        log.info("snapshot deleted", extra=fields(snapshot_id=snapshot_id_text))

    # ---- lookups for ListSnapshots and restores -----------------------------------------------------------

    def describe(self, session: Session, io: Ioctx, pool: str, uuid: str) -> Snapshot | None:
        """A finished snapshot by uuid (None if absent or still being cut), `pool` being the one
        its id names: its image's, also when ceph-csi journaled it in another (split_journal)."""
        v = self.volumes
        snapshots = sources.snapshot_journal(io, v.instance_id, v.journal_lock_seconds, v.keeper, session)
        try:
            record = snapshots.read(uuid)  # wherever ceph-csi journaled it
        except CephCSIError as error:
            log.info("snapshot journaled in another pool cannot be read; not listed",
                     extra=fields(pool=pool, uuid=uuid, error=error.message))
            return None
        # ceph-csi's split records are read, never written.
        writable = None if record is not None and record.get(JOURNAL_POOL) else snapshots
        if record is None or not (record.get(SOURCE_VOLUME_ID) or _source_of_ceph_csi_snapshot(session, io, record)):
            return None
        shape = self._restore_point(io, record.image_name)
        if shape is None:
            return None
        return self._describe(session, io, pool, writable, record, shape, queue=False)

    def all_in_pool(self, session: Session, io: Ioctx, pool: str) -> list[Snapshot]:
        """The snapshots this pool's snapshot journal names, including those ceph-csi journaled
        here with their image in another pool (a `<pool id>/<uuid>` key)."""
        _, snapshots = self._journals(io, session)
        values = set(snapshots.uuids().values())
        found = [self.describe(session, io, pool, uuid) for uuid in sorted(v for v in values if "/" not in v)]
        found.extend(self._describe_elsewhere(session, io, value) for value in sorted(v for v in values if "/" in v))
        return [s for s in found if s is not None]

    def _describe_elsewhere(self, session: Session, io: Ioctx, raw: str) -> Snapshot | None:
        try:
            value = parse_name_value(raw, "snapshot name key")
        except CephCSIError:
            return None  # reported by `cephcsi audit`
        image_pool = session.pool_name(value.image_pool_id) if value.image_pool_id is not None else None
        if image_pool is None:
            return None
        try:
            with session.ioctx(image_pool, io.get_namespace()) as image_io:
                return self.describe(session, image_io, image_pool, value.uuid)
        except NotFound:
            return None  # the pool went away since the line above


@dataclass(frozen=True)
class _Shape:
    """What an answer about a finished snapshot needs from its image."""

    size: int
    image_id: str
    cut_at: float = 0.0
    """When the restore point was taken (0: not read)."""

    @classmethod
    def of(cls, image: image_access.Image) -> _Shape:
        return cls(int(image.size()), str(image.id()))


def _source_of_ceph_csi_snapshot(session: Session, io: Ioctx, record: Record) -> str:
    """The source volume id of a snapshot ceph-csi made ('' when the record cannot say).

    ceph-csi's record keeps only the source's image name (csi.source). Its volumes' images are
    named <volumeNamePrefix><uuid>, and its snapshots go to their source's pool, so the id it
    answered CreateSnapshot with is rebuilt from the name's uuid and this pool, whether or not
    the volume still exists (a snapshot outlives its source)."""
    candidate = VolumeId(session.cluster.cluster_id, io.get_pool_id(), record.get(SOURCE)[-36:]).encode()
    try:
        VolumeId.decode(candidate)  # the name ends in a uuid
    except MalformedId:
        return ""
    return candidate


def _data_pool(session: Session, image: image_access.Image, io: Ioctx) -> str | None:
    """The image's data pool name when it has a separate one (the clone keeps data there too)."""
    pool_id = int(image.data_pool_id())
    if pool_id == io.get_pool_id():
        return None
    return session.pool_name(pool_id)
