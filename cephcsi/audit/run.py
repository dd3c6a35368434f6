"""One audit from start to end: connect, read, classify, optionally repair. No output here
(cephcsi.audit.report renders the result; cephcsi.cli.audit prints it)."""
from __future__ import annotations

from dataclasses import dataclass, field

import rados

from cephcsi.audit import owners as owner_info
from cephcsi.audit.classify import classify
from cephcsi.audit.model import ContentView, Finding, ImageEntry, PVView, Snapshot
from cephcsi.audit.pvs import list_pvs
from cephcsi.audit.repair import RepairContext, repair_all
from cephcsi.audit.report import AuditResult, Scope
from cephcsi.audit.scan import read_owners, read_snapshot
from cephcsi.audit.snapshot_contents import GROUP, VERSION, list_contents
from cephcsi.ceph import trash
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.settings import CephSettings
from cephcsi.volumes.group_snapshots import GROUPS
from cephcsi.volumes.journal import SNAPSHOTS, VOLUMES, Journal
from cephcsi.volumes.parameters import DEFAULT_PREFIX
from cephcsi.volumes.snapshots import DEFAULT_PREFIX as DEFAULT_SNAPSHOT_PREFIX

DRIVER_NAME = "rbd.csi.ceph.com"
NO_SNAPSHOT_CRDS = (f"VolumeSnapshotContents not checked: the API server does not serve {GROUP}/{VERSION} "
                    "(the snapshot CRDs are not installed, so no content can name a snapshot)")


@dataclass(frozen=True)
class AuditOptions:
    config_file: str
    cluster_id: str
    pool: str
    credentials: Credentials = field(repr=False)
    rados_namespace: str | None = None
    """None: the cluster's radosNamespace from config.json (what the driver uses)."""
    instance_id: str = "default"
    prefix: str = DEFAULT_PREFIX
    snapshot_prefix: str = DEFAULT_SNAPSHOT_PREFIX
    """VolumeSnapshotClass snapshotNamePrefix: what names snapshot images."""
    kubeconfig: str = ""
    driver_name: str = DRIVER_NAME
    list_images: bool = False
    """Also list every live image with its journal name, PVs and owner metadata."""
    repair: bool = False
    repair_orphan_images: bool = False
    orphan_deferment_seconds: int = 7 * 24 * 3600
    inline_purge_seconds: float = 20.0
    journal_lock_seconds: float = 60.0
    """Longer than any one repair (an inline purge included): the lock must not expire under it."""
    ceph: CephSettings = CephSettings()


def audit(options: AuditOptions, keeper: LeaseKeeper) -> AuditResult:
    """Raises CephCSIError when the cluster or pool cannot be read at all, cephcsi.kube's
    KubeError when the API server cannot; a repair that fails is part of the result instead.
    `keeper` holds the repairs' journal leases (cephcsi.cli.audit builds it)."""
    cluster = ClusterRegistry(options.config_file).get(options.cluster_id)
    connections = ConnectionCache(options.ceph)
    try:
        with connections.session(cluster, options.credentials) as session, \
                session.ioctx(options.pool, options.rados_namespace) as io:
            pvs, contents, kube_notes = _read_kube(options, io.get_pool_id())
            snapshot = read_snapshot(session, io, options.pool, options.instance_id, options.prefix, pvs,
                                     options.ceph.mon_op_timeout, options.snapshot_prefix, contents)
            findings, images, notes = _with_owners(io, snapshot, classify(snapshot), options.list_images)
            repairs = None
            if options.repair:
                context = RepairContext(
                    session=session, io=io, pool=options.pool,
                    journal=Journal(io, options.instance_id, VOLUMES, lock_seconds=options.journal_lock_seconds,
                                    keeper=keeper),
                    snapshot=snapshot, inline=trash.InlinePurges(options.inline_purge_seconds),
                    allow_orphan_images=options.repair_orphan_images,
                    orphan_deferment_seconds=options.orphan_deferment_seconds,
                    snap_journal=Journal(io, options.instance_id, SNAPSHOTS,
                                         lock_seconds=options.journal_lock_seconds, keeper=keeper),
                    group_journal=Journal(io, options.instance_id, GROUPS,
                                          lock_seconds=options.journal_lock_seconds, keeper=keeper),
                )
                repairs = tuple(repair_all(context, findings))
            scope = Scope(options.cluster_id, options.pool, io.get_namespace(), options.instance_id,
                          options.prefix, pvs is not None, options.snapshot_prefix, contents is not None)
            return AuditResult(scope, tuple(findings), repairs, kube_notes + snapshot.notes + notes, images)
    finally:
        connections.close_all()


def _read_kube(options: AuditOptions, pool_id: int
               ) -> tuple[tuple[PVView, ...] | None, tuple[ContentView, ...] | None, tuple[str, ...]]:
    """(PVs, VolumeSnapshotContents, notes): both None without a kubeconfig, the contents None
    (and a note saying so) when the snapshot CRDs are not installed."""
    if not options.kubeconfig:
        return None, None, ()
    pvs = list_pvs(options.kubeconfig, options.driver_name, options.cluster_id, pool_id, options.pool)
    contents = list_contents(options.kubeconfig, options.driver_name, options.cluster_id, pool_id)
    return pvs, contents, (NO_SNAPSHOT_CRDS,) if contents is None else ()


def _with_owners(io: rados.Ioctx, snapshot: Snapshot, findings: list[Finding], list_images: bool
                 ) -> tuple[list[Finding], tuple[ImageEntry, ...] | None, tuple[str, ...]]:
    """Findings with their images' owner metadata, and the listing when asked for. Read before
    any repair, so a repaired (trashed) orphan still shows whose it was."""
    targets = owner_info.finding_targets(snapshot, findings)
    if list_images:
        targets = sorted(set(targets) | set(owner_info.live_images(snapshot)), key=lambda t: t[1])
    owners, notes = read_owners(io, targets)
    images = owner_info.listing(snapshot, owners) if list_images else None
    return owner_info.with_owners(snapshot, findings, owners), images, tuple(notes)
