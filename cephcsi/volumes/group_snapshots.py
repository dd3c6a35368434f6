"""CSI volume group snapshots: one crash-consistent instant across several volumes, each member
kept as an ordinary snapshot (`csi-snap-<uuid>` in the snapshot journal) that restores,
DeleteSnapshot and ListSnapshots treat like any other. Journal in ceph-csi's group layout, so
the two drivers read each other's group snapshots. Every step is atomic and ordered so that a
retry after a kill completes the rest and DeleteVolumeGroupSnapshot undoes any prefix; members
are never cut from two instants. Layout, ids and step order: docs/design/controller.md."""
from __future__ import annotations

import datetime
import itertools
import logging
import time
import uuid as uuids
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from cephcsi.ceph import groups, image_access, images, layering, omap
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.errors import ceph_call
from cephcsi.errors import AlreadyExists, FailedPrecondition, Internal, InvalidArgument, NotFound, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.observability.logging import fields
from cephcsi.volumes import by_id, encrypted, failpoints, sources
from cephcsi.volumes.journal import IMAGE_ID, NAME_FIELD_VOLUME, SOURCE, Claim, Journal, JournalKind, Record
from cephcsi.volumes.snapshots import CREATED, DEFAULT_PREFIX, SOURCE_VOLUME_ID, Snapshot, SnapshotManager
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)

GROUPS = JournalKind("csi.groups.", "csi.volume.group.", "csi.volume.group.", NAME_FIELD_VOLUME, "csi-vol-group-")
GROUP_NAME = "csi.groupname"
GROUP_CREATED = "csi.creationtime"
"""ceph-csi's: Go's time.MarshalText (RFC 3339 with nanoseconds) of the reservation."""
_NOT_MEMBERS = frozenset({GROUP_NAME, GROUP_CREATED})
MEMBER_NAMESPACE = uuids.UUID("6d0f3c4e-8a51-4c3e-9a55-2f8e3f1b7c21")
"""Fixed namespace of the uuid5 that names a member snapshot after (group uuid, source id)."""
KNOWN_KEYS = ("clusterID", "pool", "snapshotNamePrefix", "groupNamePrefix")
KUBERNETES_PREFIX = "csi.storage.k8s.io/"


@dataclass(frozen=True)
class GroupParameters:
    """VolumeGroupSnapshotClass parameters (ceph-csi's names)."""

    cluster_id: str = ""
    pool: str = ""
    snapshot_prefix: str = DEFAULT_PREFIX
    group_prefix: str = GROUPS.default_image_prefix

    @classmethod
    def parse(cls, parameters: Mapping[str, str]) -> GroupParameters:
        unknown = sorted(k for k in parameters if k not in KNOWN_KEYS and not k.startswith(KUBERNETES_PREFIX))
        if unknown:
            raise InvalidArgument(f"unknown group snapshot parameter(s) {', '.join(unknown)}; "
                                  f"supported: {', '.join(KNOWN_KEYS)}")
        values = {}
        for key, default in (("snapshotNamePrefix", DEFAULT_PREFIX), ("groupNamePrefix", GROUPS.default_image_prefix)):
            prefix = parameters.get(key, default)
            if not prefix or len(prefix) > 64 or not all(c.isalnum() or c in "._-" for c in prefix):
                raise InvalidArgument(f"parameter {key}={prefix!r} must be 1-64 letters, digits, '.', '_' or '-'")
            values[key] = prefix
        return cls(parameters.get("clusterID", ""), parameters.get("pool", ""),
                   values["snapshotNamePrefix"], values["groupNamePrefix"])


@dataclass(frozen=True)
class GroupSnapshotRequest:
    name: str
    source_volume_ids: Sequence[str]
    parameters: GroupParameters
    credentials: Credentials


@dataclass(frozen=True)
class GroupSnapshot:
    group_snapshot_id: str
    snapshots: list[Snapshot]
    creation_time: float
    ready: bool


@dataclass(frozen=True)
class _Member:
    uuid: str
    snapshot_id: str
    source_volume_id: str
    image_name: str


def member_uuid(group_uuid: str, source_volume_id: str) -> str:
    return str(uuids.uuid5(MEMBER_NAMESPACE, f"{group_uuid}/{source_volume_id}"))


def member_ids(record: Record) -> dict[str, str]:
    """The record's member map: snapshot id → image name (every key that is not one of ceph-csi's
    own fields, as ceph-csi reads it)."""
    return {key: value for key, value in record.extra if key not in _NOT_MEMBERS}


def parse_go_time(text: str) -> float | None:
    """Epoch seconds of Go's time.MarshalText output (nanoseconds cut to micro); None if not one."""
    if not text:
        return None
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(itertools.takewhile(str.isdigit, rest))
        zone = rest[len(digits):]
        text = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def go_time(epoch: float) -> str:
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond:06d}000Z"


class GroupSnapshotManager:
    def __init__(self, snapshots: SnapshotManager) -> None:
        self.snapshots = snapshots
        self.volumes = snapshots.volumes
        self.name_locks = KeyLocks("group snapshot name")
        self.id_locks = KeyLocks("group snapshot")

    def _groups(self, io: Ioctx) -> Journal:
        v = self.volumes
        return Journal(io, v.instance_id, GROUPS, lock_seconds=v.journal_lock_seconds, keeper=v.keeper)

    # ---- CreateVolumeGroupSnapshot ----------------------------------------------------------------

    def create(self, request: GroupSnapshotRequest) -> GroupSnapshot:
        source_ids = self._decode_sources(request)
        first = source_ids[0]
        params = request.parameters
        if params.cluster_id and params.cluster_id != first.cluster_id:
            raise InvalidArgument(f"parameter clusterID={params.cluster_id!r} differs from the volumes' cluster "
                                  f"{first.cluster_id!r}; group snapshots are kept in their volumes' cluster")
        cluster = self.volumes.clusters.get(first.cluster_id)
        with self.name_locks.hold(request.name), \
                self.volumes.connections.session(cluster, request.credentials) as session, \
                sources.opened(session, first, "source volume") as (pool, io):
            if params.pool and params.pool != pool:
                raise InvalidArgument(f"parameter pool={params.pool!r} differs from the volumes' pool {pool!r}; "
                                      "group snapshots are kept in their volumes' pool")
            groups_journal = self._groups(io)
            for _ in range(2):
                group_uuid = groups_journal.reserve(request.name, VolumeId.new_uuid())
                failpoints.reach("group.after-reserve")
                with groups_journal.locked(group_uuid):
                    if groups_journal.lookup(request.name) != group_uuid:
                        groups_journal.discard_orphan(group_uuid)
                        continue
                    record, members = self._claim(session, io, pool, groups_journal, group_uuid, request)
                    self._complete(session, io, pool, record, members)
                    return self._describe(session, io, pool, record, members, strict=True)
            raise OperationInFlight(f"group snapshot {request.name!r} is being deleted concurrently; retry")

    @staticmethod
    def _decode_sources(request: GroupSnapshotRequest) -> list[VolumeId]:
        texts = list(request.source_volume_ids)
        if len(set(texts)) != len(texts):
            raise InvalidArgument("source_volume_ids names a volume more than once")
        decoded = [sources.decode(text, "source volume") for text in texts]
        clusters = sorted({d.cluster_id for d in decoded})
        if len(clusters) > 1:
            raise InvalidArgument(f"the volumes are in different clusters ({', '.join(clusters)}); "
                                  "a group snapshot's volumes must share one cluster and pool")
        pool_ids = sorted({d.pool_id for d in decoded})
        if len(pool_ids) > 1:
            raise InvalidArgument(f"the volumes are in different pools (pool ids {', '.join(map(str, pool_ids))}); "
                                  "a group snapshot's volumes must share one pool (one RBD group)")
        return decoded

    def _claim(self, session: Session, io: Ioctx, pool: str, groups_journal: Journal, group_uuid: str,
               request: GroupSnapshotRequest) -> tuple[Record, list[_Member]]:
        """The group's record and members: written now if new (after checking every source),
        else checked against the request."""
        volumes, snapshots = self.snapshots._journals(io, session)
        planned = [_Member(member_uuid(group_uuid, sid), VolumeId(VolumeId.decode(sid).cluster_id, io.get_pool_id(),
                                                                    member_uuid(group_uuid, sid)).encode(),
                           sid, f"{request.parameters.snapshot_prefix}{member_uuid(group_uuid, sid)}")
                   for sid in request.source_volume_ids]
        record = groups_journal.read(group_uuid)
        if record is None:
            source_images = {}
            for member in planned:
                source = volumes.read(sources.decode(member.source_volume_id, "source volume").object_uuid)
                if source is None or encrypted.spec_of(source) is not None:
                    groups_journal.release_name(request.name, group_uuid)
                    groups_journal.discard_orphan(group_uuid)
                    if source is None:
                        raise NotFound(f"source volume {member.source_volume_id!r} does not exist")
                    raise FailedPrecondition(
                        f"source volume {member.source_volume_id!r} is encrypted; group snapshots of encrypted "
                        "volumes are not supported (take single snapshots of them)")
                source_images[member.source_volume_id] = source.image_name
            values = {NAME_FIELD_VOLUME: request.name,
                      GROUP_NAME: f"{request.parameters.group_prefix}{group_uuid}",
                      GROUP_CREATED: go_time(time.time()),
                      **{m.snapshot_id: m.image_name for m in planned}}
            omap.set_unless_key(io, f"{GROUPS.record_prefix}{group_uuid}", NAME_FIELD_VOLUME, values)
            failpoints.reach("group.after-record")
            record = groups_journal.read(group_uuid)
            if record is None:
                raise Internal(f"group snapshot record {group_uuid} disappeared while it was written; retry")
            for member in planned:
                self._claim_member(snapshots, request.name, member, source_images[member.source_volume_id])
            failpoints.reach("group.after-members")
        if record.name != request.name:
            raise Internal(f"group snapshot record {group_uuid} belongs to {record.name!r}, not {request.name!r}; "
                           "run `cephcsi audit`")
        existing = member_ids(record)
        if set(existing) != {m.snapshot_id for m in planned}:
            raise AlreadyExists(f"group snapshot {request.name!r} already exists with other volumes "
                                f"({len(existing)} members); a name is for one set of volumes")
        members = [self._member_record(session, io, snapshots, volumes, request.name, m) for m in planned]
        return record, members

    @staticmethod
    def _claim_member(snapshots: Journal, group_name: str, member: _Member, source_image: str) -> None:
        """The member's snapshot record (with the lease that writes it), then its name key: a
        key never points at a missing record."""
        name = _member_name(group_name, member.uuid)
        claim = Claim(name, member.image_name, {SOURCE: source_image, SOURCE_VOLUME_ID: member.source_volume_id})
        with snapshots.locked(member.uuid, claim=claim) as hold:
            if hold.claimed is None:
                found = snapshots.read(member.uuid)
                if found is None:
                    snapshots.claim_record(member.uuid, name, member.image_name, dict(claim.extra))
            snapshots.reserve(name, member.uuid)

    def _member_record(self, session: Session, io: Ioctx, snapshots: Journal, volumes: Journal, group_name: str,
                       member: _Member) -> _Member:
        found = snapshots.read(member.uuid)
        if found is None:
            # Killed between the group record and this member's record: write it now.
            source = volumes.read(sources.decode(member.source_volume_id, "source volume").object_uuid)
            if source is None:
                raise NotFound(f"source volume {member.source_volume_id!r} does not exist")
            self._claim_member(snapshots, group_name, member, source.image_name)
        elif found.get(SOURCE_VOLUME_ID) != member.source_volume_id:
            raise AlreadyExists(f"group snapshot {group_name!r}: member {member.snapshot_id!r} belongs to "
                                f"{found.get(SOURCE_VOLUME_ID)!r}")
        return member

    def _complete(self, session: Session, io: Ioctx, pool: str, record: Record, members: list[_Member]) -> None:
        group = record.get(GROUP_NAME) or f"{GROUPS.default_image_prefix}{record.uuid}"
        volumes, snapshots = self.snapshots._journals(io, session)
        pending = [m for m in members if not self._finished(io, m.image_name)]
        if pending:
            with ExitStack() as stack:
                held = {}
                for member in sorted(members, key=lambda m: m.source_volume_id):
                    source_uuid = sources.decode(member.source_volume_id, "source volume").object_uuid
                    held[member.source_volume_id] = stack.enter_context(sources.hold_source(volumes, source_uuid))
                point_taken = groups.group_snap_complete(io, group, group)
                if not point_taken:
                    if len(pending) != len(members):
                        raise FailedPrecondition(
                            f"group snapshot {record.name!r} lost member snapshot(s) "
                            f"{', '.join(m.snapshot_id for m in pending)} after it was taken; delete it and take a new one")
                    groups.ensure_group(io, group)
                    for member in members:
                        groups.add_member(io, group, held[member.source_volume_id].image_name)
                    failpoints.reach("group.after-rbd-group")
                    groups.create_group_snap(io, group, group)
                    failpoints.reach("group.after-group-snap")
                for member in pending:
                    self._cut_member(session, io, snapshots, group, member, held[member.source_volume_id].image_name)
        failpoints.reach("group.before-cleanup")
        if groups.group_exists(io, group):
            groups.remove_group(io, group)
        log.info("group snapshot cut", extra=fields(name=record.name, group=group, members=len(members)))

    @staticmethod
    def _finished(io: Ioctx, image_name: str) -> bool:
        if images.lookup_id(io, image_name) is None:
            return False
        with ceph_call("open snapshot image", f"image {image_name!r}"):
            return bool(image_access.if_exists(io, lambda image: layering.user_snap(image, image_name) is not None,
                                               image_name, read_only=True))

    def _cut_member(self, session: Session, io: Ioctx, snapshots: Journal, group: str, member: _Member,
                    source_image: str) -> None:
        with snapshots.locked(member.uuid):
            if self._finished(io, member.image_name):
                return
            point = groups.member_point(io, source_image, group, group)
            if point is None:
                raise Internal(f"image {source_image!r} has no snapshot of group snapshot {group!r}@{group!r}; "
                               "delete the group snapshot and take it again")
            layering.remove_debris(io, member.image_name)  # a copy killed half-way
            groups.copy_at(io, source_image, point.snap_id, member.image_name, session.pool_name)
            failpoints.reach("group.after-copy")
            with ceph_call("snapshot the snapshot image", f"image {member.image_name!r}"), \
                    image_access.open_image(io, member.image_name) as image:
                layering.ensure_snap(image, member.image_name)
                image_id, size = str(image.id()), int(image.size())
            snapshots.update(member.uuid, {CREATED: f"{point.timestamp:.6f}", IMAGE_ID: image_id,
                                           sources.FINISHED_SIZE: str(size)})
            failpoints.reach("group.after-member")

    def _describe(self, session: Session, io: Ioctx, pool: str, record: Record, members: Sequence[_Member],
                  strict: bool) -> GroupSnapshot:
        found = []
        for member in members:
            snapshot = self.snapshots.describe(session, io, pool, member.uuid)
            if snapshot is None:
                if strict:
                    raise Internal(f"member snapshot {member.snapshot_id!r} of group snapshot {record.name!r} "
                                   "is not complete right after it was cut; retry")
                continue
            found.append(snapshot)
        group_id = VolumeId(self._cluster_of(members, session), io.get_pool_id(), record.uuid).encode()
        created = min((s.creation_time for s in found), default=None) or parse_go_time(record.get(GROUP_CREATED)) \
            or time.time()
        return GroupSnapshot(group_id, found, created, len(found) == len(members) and all(s.ready for s in found))

    @staticmethod
    def _cluster_of(members: Sequence[_Member], session: Session) -> str:
        for member in members:
            try:
                return VolumeId.decode(member.snapshot_id).cluster_id
            except MalformedId:
                continue
        return session.cluster.cluster_id

    # ---- Get / Delete ------------------------------------------------------------------------------

    @contextmanager
    def _opened(self, group_snapshot_id: str, credentials: Credentials, missing_ok: bool
                ) -> Iterator[tuple[Session, Ioctx, str, VolumeId] | None]:
        try:
            group_id = VolumeId.decode(group_snapshot_id)
        except MalformedId:
            if missing_ok:
                yield None
                return
            raise NotFound(f"group snapshot {group_snapshot_id!r} does not exist (not an id issued by this driver)")
        cluster = self.volumes.clusters.get(group_id.cluster_id)
        with self.volumes.connections.session(cluster, credentials) as session, \
                by_id.pool_if_present(session, group_id) as found:
            if found is None:
                if missing_ok:
                    yield None
                    return
                raise by_id.pool_gone(f"group snapshot {group_snapshot_id!r}")
            pool, io = found
            yield session, io, pool, group_id

    def get(self, group_snapshot_id: str, snapshot_ids: Sequence[str], credentials: Credentials) -> GroupSnapshot:
        with self._opened(group_snapshot_id, credentials, missing_ok=False) as opened:
            assert opened is not None
            session, io, pool, group_id = opened
            record = self._groups(io).read(group_id.object_uuid)
            if record is None:
                raise NotFound(f"group snapshot {group_snapshot_id!r} does not exist")
            members = self._members_of(record)
            _check_listed(group_snapshot_id, members, snapshot_ids)
            return self._describe(session, io, pool, record, members, strict=False)

    def _members_of(self, record: Record) -> list[_Member]:
        members = []
        for snapshot_id, image_name in sorted(member_ids(record).items()):
            try:
                decoded = VolumeId.decode(snapshot_id)
            except MalformedId:
                raise Internal(f"group snapshot {record.name!r} has a member key {snapshot_id!r} that is no "
                               "snapshot id; run `cephcsi audit`") from None
            members.append(_Member(decoded.object_uuid, snapshot_id, "", image_name))
        return members

    def delete(self, group_snapshot_id: str, snapshot_ids: Sequence[str], secrets: Mapping[str, str]) -> None:
        """Delete the group snapshot and its member snapshots; one already gone counts as deleted."""
        with self.id_locks.hold(group_snapshot_id), \
                self._opened(group_snapshot_id, Credentials.from_secrets(secrets), missing_ok=True) as opened:
            if opened is None:
                return
            session, io, pool, group_id = opened
            groups_journal = self._groups(io)
            with groups_journal.locked(group_id.object_uuid):
                record = groups_journal.read(group_id.object_uuid)
                if record is None:
                    groups_journal.discard_orphan(group_id.object_uuid)
                    return
                members = self._members_of(record)
                _check_listed(group_snapshot_id, members, snapshot_ids)
                group = record.get(GROUP_NAME) or f"{GROUPS.default_image_prefix}{record.uuid}"
                # The RBD group (a create killed before its clean-up) first: it holds the sources.
                if groups.group_exists(io, group):
                    groups.remove_group(io, group)
                failpoints.reach("group.delete.after-rbd-group")
                _, snapshots = self.snapshots._journals(io, session)
                for member in members:
                    self.snapshots.delete(member.snapshot_id, secrets)
                    # A member whose record never got its name key has nothing more to release.
                    snapshots.release_name(_member_name(record.name, member.uuid), member.uuid)
                    failpoints.reach("group.delete.after-member")
                groups_journal.release_name(record.name, record.uuid)
                groups_journal.remove_record(record.uuid)
        log.info("group snapshot deleted", extra=fields(group_snapshot_id=group_snapshot_id))


def _member_name(group_name: str, member_uuid_: str) -> str:
    """The member snapshot's request name in the snapshot journal."""
    return f"{group_name}-{member_uuid_}"


def _check_listed(group_snapshot_id: str, members: Sequence[_Member], snapshot_ids: Sequence[str]) -> None:
    if snapshot_ids and set(snapshot_ids) != {m.snapshot_id for m in members}:
        raise InvalidArgument(f"snapshot_ids do not match the snapshots of group snapshot {group_snapshot_id!r}")
