"""ListSnapshots: by snapshot id, by source volume, or every snapshot this driver instance has.

Entries are ordered by snapshot id and the page token is the last id returned, so paging is
stable across calls: snapshots created or deleted between pages never shift or repeat others.
"Every snapshot" reads the snapshot journal of each pool the credentials can read in every
configured cluster (pools without a journal, or not readable by the user, hold none of ours).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.errors import LibradosError, ceph_call
from cephcsi.errors import CephCSIError, InvalidArgument, NotFound, OperationInFlight
from cephcsi.observability.logging import fields
from cephcsi.volumes import split_journal
from cephcsi.volumes.journal import VOLUMES
from cephcsi.volumes.snapshots import Snapshot, SnapshotManager
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ListRequest:
    snapshot_id: str = ""
    source_volume_id: str = ""
    max_entries: int = 0
    starting_token: str = ""
    credentials: Credentials | None = None


@dataclass(frozen=True)
class Page:
    entries: list[Snapshot]
    next_token: str


def list_snapshots(manager: SnapshotManager, request: ListRequest) -> Page:
    if request.max_entries < 0:
        raise InvalidArgument("max_entries must not be negative")
    if request.starting_token:
        try:
            VolumeId.decode(request.starting_token)
        except MalformedId:
            # The spec's code for a token this plugin did not issue.
            raise OperationInFlight(f"starting_token {request.starting_token!r} was not issued by this driver; "
                                    "start the listing again without it") from None
    found = sorted(_matching(manager, request), key=lambda s: s.snapshot_id)
    if request.starting_token:
        found = [s for s in found if s.snapshot_id > request.starting_token]
    if request.max_entries and len(found) > request.max_entries:
        page = found[: request.max_entries]
        return Page(page, page[-1].snapshot_id)
    return Page(found, "")


def _matching(manager: SnapshotManager, request: ListRequest) -> list[Snapshot]:
    if request.snapshot_id:
        return _by_id(manager, request.snapshot_id, _credentials(request))
    if request.source_volume_id:
        try:
            source = VolumeId.decode(request.source_volume_id)
        except MalformedId:
            return []
        return [s for s in _in_pool_of(manager, source, _credentials(request))
                if s.source_volume_id == request.source_volume_id]
    return _everywhere(manager, _credentials(request))


def _credentials(request: ListRequest) -> Credentials:
    if request.credentials is None:
        raise InvalidArgument("secrets are required to read the snapshot journal (userID and userKey; "
                              "in Kubernetes: csi.storage.k8s.io/snapshotter-list-secret-* or the snapshotter secret)")
    return request.credentials


def _by_id(manager: SnapshotManager, text: str, credentials: Credentials) -> list[Snapshot]:
    try:
        snapshot_id = VolumeId.decode(text)
    except MalformedId:
        return []
    try:
        cluster = manager.volumes.clusters.get(snapshot_id.cluster_id)
    except NotFound:
        return []
    with manager.volumes.connections.session(cluster, credentials) as session:
        pool = session.pool_name(snapshot_id.pool_id)
        if pool is None:
            return []
        with session.ioctx(pool) as io:
            found = manager.describe(session, io, pool, snapshot_id.object_uuid)
    return [found] if found is not None else []


def _in_pool_of(manager: SnapshotManager, entry_id: VolumeId, credentials: Credentials) -> list[Snapshot]:
    """The snapshots journaled in the source volume's pool, and in the pool ceph-csi journaled it
    in when it split a topology-constrained volume (its snapshots' keys are there too)."""
    try:
        cluster = manager.volumes.clusters.get(entry_id.cluster_id)
    except NotFound:
        return []
    with manager.volumes.connections.session(cluster, credentials) as session:
        pool = session.pool_name(entry_id.pool_id)
        if pool is None:
            return []
        with session.ioctx(pool) as io:
            found = manager.all_in_pool(session, io, pool)
            journal_pool = _split_journal_pool(session, io, pool, entry_id.object_uuid)
        if journal_pool is not None:
            found.extend(_pool_snapshots(manager, session, journal_pool))
        return found


def _split_journal_pool(session: Session, io: Ioctx, pool: str, volume_uuid: str) -> str | None:
    try:
        split = split_journal.locate(session, io, pool, VOLUMES, volume_uuid)
    except CephCSIError:
        return None  # a broken split journal: `cephcsi audit` reports it
    return split.journal_pool if split is not None and split.journal_pool != pool else None


def _everywhere(manager: SnapshotManager, credentials: Credentials) -> list[Snapshot]:
    found: list[Snapshot] = []
    for cluster_id in manager.volumes.clusters.ids():
        cluster = manager.volumes.clusters.get(cluster_id)
        with manager.volumes.connections.session(cluster, credentials) as session:
            with ceph_call("list pools", f"cluster {cluster_id!r}"):
                pools = [str(p) for p in session.rados.list_pools()]
            for pool in pools:
                found.extend(_pool_snapshots(manager, session, pool))
    return found


def _pool_snapshots(manager: SnapshotManager, session: Session, pool: str) -> list[Snapshot]:
    try:
        with session.ioctx(pool) as io:
            return manager.all_in_pool(session, io, pool)
    except (CephCSIError, LibradosError) as error:
        # A pool these credentials cannot read holds no snapshot they could use either.
        log.debug("skipping pool in snapshot listing", extra=fields(pool=pool, reason=str(error)))
        return []
