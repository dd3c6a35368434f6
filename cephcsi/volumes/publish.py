"""ControllerPublish/Unpublish records and fencing, in ceph-csi's image-metadata keys.

A node holds a volume while `.rbd.csi.ceph.com/clientaddress|userid/<volume id>/<node id>` is on
the image; a second read-write holder of a single-node volume is refused, by one guarded RADOS
op across processes. Unpublish from an out-of-service node records each address in the pool's
`csi.fenced` ledger and blocklists it before the keys go; `unfence` reverses it.
Keys, steps and crash windows: docs/design/controller.md, "volumes/publish.py".
"""
from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from cephcsi.ceph import blocklist, header_metadata, images, omap
from cephcsi.ceph.connection import ConnectionCache, Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.ceph.publish_keys import (ADDRESS_PREFIX, EARLY_ADDRESS_PREFIX, FENCE_LEDGER, NODE_ADDRESSES, PUBLISH_GUARD,
                                       USER_PREFIX)
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.errors import FailedPrecondition, InvalidArgument, NotFound, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.observability.logging import fields
from cephcsi.volumes import failpoints
from cephcsi.volumes.journal import Record
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)

FENCE_SECONDS = 365 * 24 * 3600
"""Blocklist expiry (ceph-csi's: one year). Long enough to outlast any outage; `unfence`
removes the entries when the node is back."""
_GUARD_ATTEMPTS = 5
"""Reads-and-guarded-writes of a publish before it gives up (ABORTED): each lost attempt means
another publish of the volume landed in between, so a few suffice unless callers storm it."""
MAX_NODE_ID = 253
_NODE_ID = re.compile(r"^[^/\s\x00]+$")


def address_key(volume_id: str, node_id: str) -> str:
    return f"{ADDRESS_PREFIX}{volume_id}/{node_id}"


def user_key(volume_id: str, node_id: str) -> str:
    return f"{USER_PREFIX}{volume_id}/{node_id}"


def early_address_key(node_id: str) -> str:
    return f"{EARLY_ADDRESS_PREFIX}{node_id}"


def check_node_id(node_id: str) -> None:
    if not node_id:
        raise InvalidArgument("node_id is required (the node's id from NodeGetInfo)")
    if len(node_id) > MAX_NODE_ID or not _NODE_ID.match(node_id):
        raise InvalidArgument(f"node_id {node_id[:80]!r} is not a node id this driver issues (NodeGetInfo answers "
                              f"the node name: at most {MAX_NODE_ID} characters, no '/' or whitespace)")


def holders(metadata: Mapping[str, str], volume_id: str) -> dict[str, str]:
    """Nodes the metadata records as holding the volume → their address ('' when not reported)."""
    found: dict[str, str] = {}
    own = f"{ADDRESS_PREFIX}{volume_id}/"
    for key, value in metadata.items():
        if key.startswith(own):
            node = key[len(own):]
        elif key.startswith(EARLY_ADDRESS_PREFIX):
            node = key[len(EARLY_ADDRESS_PREFIX):]
        else:
            continue
        if node and (value or node not in found):
            found[node] = value
    return found


def node_keys(metadata: Mapping[str, str], volume_id: str, node_id: str) -> list[str]:
    wanted = {address_key(volume_id, node_id), user_key(volume_id, node_id), early_address_key(node_id)}
    return sorted(k for k in metadata if k in wanted)


class RecordReader(Protocol):
    """VolumeManager.read_record: a volume's journal record, wherever ceph-csi put it."""

    def __call__(self, session: Session, io: Ioctx, pool: str, uuid: str) -> Record | None: ...


@dataclass(frozen=True)
class Target:
    """The image a volume id names, with its header id."""

    volume_id: VolumeId
    pool: str
    record: Record
    header_id: str


class Publisher:
    def __init__(self, clusters: ClusterRegistry, connections: ConnectionCache, read_record: RecordReader,
                 fence_seconds: int = FENCE_SECONDS, mon_timeout: float = 10.0) -> None:
        self.clusters = clusters
        self.connections = connections
        self.read_record = read_record
        self.fence_seconds = fence_seconds
        self.mon_timeout = mon_timeout
        self.locks = KeyLocks("volume")

    def publish(self, volume_id: str, node_id: str, single_node: bool, credentials: Credentials) -> None:
        check_node_id(node_id)
        parsed = _decode(volume_id)
        with self.locks.hold(volume_id), self._session(parsed, credentials) as session:
            target = self._target(session, parsed)
            if target is None:
                raise NotFound(f"volume {volume_id!r} does not exist")
            with session.ioctx(target.pool) as io:
                if not self._record(io, target, node_id, single_node, credentials):
                    return  # published already: idempotent
        log.info("volume published", extra=fields(volume=volume_id, node=node_id, image=target.record.image_name))

    def unpublish(self, volume_id: str, node_id: str, credentials: Credentials, fence: bool) -> list[str]:
        """Clear the node's record; with `fence`, blocklist its clients first. Returns the
        addresses blocklisted. A volume that is gone counts as unpublished."""
        check_node_id(node_id)
        try:
            parsed = VolumeId.decode(volume_id)
        except MalformedId:
            return []
        with self.locks.hold(volume_id), self._session(parsed, credentials) as session:
            target = self._target(session, parsed)
            if target is None:
                return []
            with session.ioctx(target.pool) as io:
                try:
                    metadata = header_metadata.read(io, target.record.image_name, target.header_id)
                except NotFound:
                    return []
                fenced = self._fence(session, io, target, metadata, node_id) if fence else []
                keys = node_keys(metadata, volume_id, node_id)
                if keys:
                    header_metadata.remove_keys(io, target.record.image_name, target.header_id, keys)
        log.info("volume unpublished", extra=fields(volume=volume_id, node=node_id, fenced=fenced))
        return fenced

    def unfence(self, cluster_id: str, pool: str, node_id: str, credentials: Credentials) -> list[str]:
        """Remove the blocklist entries the ledger of `pool` holds for `node_id`, then those
        ledger entries. Returns the addresses unblocked."""
        check_node_id(node_id)
        cluster = self.clusters.get(cluster_id)
        with self.connections.session(cluster, credentials) as session, session.ioctx(pool) as io:
            ledger = omap.read(io, FENCE_LEDGER) or {}
            mine = sorted(k for k in ledger if k.startswith(node_id + "/"))
            for key in mine:
                blocklist.remove(session.rados, key[len(node_id) + 1:], self.mon_timeout)
            failpoints.reach("unfence.after-blocklist")
            if mine:
                omap.remove_keys(io, FENCE_LEDGER, tuple(mine))
        return [k[len(node_id) + 1:] for k in mine]

    def fenced(self, cluster_id: str, pool: str, credentials: Credentials) -> dict[str, str]:
        """The pool's fence ledger: `<node id>/<address>` → volume id."""
        cluster = self.clusters.get(cluster_id)
        with self.connections.session(cluster, credentials, keep=False) as session, session.ioctx(pool) as io:
            return omap.read(io, FENCE_LEDGER) or {}

    # ---- steps ---------------------------------------------------------------------------------

    def _record(self, io: Ioctx, target: Target, node_id: str, single_node: bool, credentials: Credentials) -> bool:
        """Write the node's record unless it is there (False) or, for a single-node volume,
        another node holds the volume (FailedPrecondition naming it).

        The check and the write must be one atomic step across processes, not just in this one:
        two controller replicas right after a leader change (or a stale leader) may publish the
        same volume to two nodes at once, and the per-volume lock of each process does not see
        the other's call. Both would read "nobody holds it" and both write their record. So the
        record is written with an omap compare on the header in the same RADOS operation: the
        header's PUBLISH_GUARD key must still hold the token read together with the holders,
        and the write replaces it. The second writer's compare fails (nothing written); it reads
        again, now sees the first node, and is refused. The holders themselves cannot be
        compared (a compare names keys, and the competitor's key is not known in advance)."""
        volume_id = target.volume_id.encode()
        name, header = target.record.image_name, target.header_id
        for _ in range(_GUARD_ATTEMPTS):
            metadata, token = header_metadata.read_guarded(io, name, header, PUBLISH_GUARD)
            held = holders(metadata, volume_id)
            if node_id in held:
                return False
            others = sorted(n for n in held if n != node_id)
            if single_node and others:
                raise FailedPrecondition(
                    f"volume {volume_id!r} is published to node {', '.join(others)} and its access mode allows "
                    f"one node only; it can be published to {node_id!r} once Kubernetes detached it from there "
                    "(the pod there is gone). If that node is lost, mark it out of service: kubectl taint nodes "
                    f"{others[0]} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute "
                    "(docs/troubleshooting.md, Node loss)")
            failpoints.reach("publish.before-record")
            if header_metadata.set_keys_if(io, name, header, {
                    address_key(volume_id, node_id): "", user_key(volume_id, node_id): credentials.user_id},
                    PUBLISH_GUARD, token, uuid.uuid4().hex):
                return True
            log.info("volume's publish record changed by another writer meanwhile; reading it again",
                     extra=fields(volume=volume_id, node=node_id, image=name))
        raise OperationInFlight(f"volume {volume_id!r} is being published by other callers at the same time "
                                f"({_GUARD_ATTEMPTS} attempts to record node {node_id!r} lost the race); retry")

    def _fence(self, session: Session, io: Ioctx, target: Target, metadata: Mapping[str, str],
               node_id: str) -> list[str]:
        volume_id = target.volume_id.encode()
        held = holders(metadata, volume_id)
        addresses = {held[node_id]} if held.get(node_id) else set()
        if not addresses:
            reported = (omap.read(io, NODE_ADDRESSES, (node_id,)) or {}).get(node_id)
            addresses = {reported} if reported else set()
        if not (set(held) - {node_id}):
            # Nobody else holds it: whoever watches the image is that node's client.
            addresses |= {w for w in _watchers(io, target) if w}
        if not addresses:
            log.warning("node out of service but no Ceph client address is known for it on this volume; nothing "
                        "to blocklist (it never staged the volume, or its node plugin did not report the address)",
                        extra=fields(volume=volume_id, node=node_id))
            return []
        entries = {f"{node_id}/{blocklist.normalise(a)}": volume_id for a in sorted(addresses)}
        # The ledger first: a crash after the blocklist must still leave what unfence undoes.
        _ledger_add(io, entries)
        for address in sorted(addresses):
            blocklist.add(session.rados, address, self.fence_seconds, self.mon_timeout)
        failpoints.reach("unpublish.after-blocklist")
        return sorted(blocklist.normalise(a) for a in addresses)

    def _session(self, volume_id: VolumeId, credentials: Credentials) -> AbstractContextManager[Session]:
        return self.connections.session(self.clusters.get(volume_id.cluster_id), credentials)

    def _target(self, session: Session, volume_id: VolumeId) -> Target | None:
        pool = session.pool_name(volume_id.pool_id)
        if pool is None:
            return None
        with session.ioctx(pool) as io:
            record = self.read_record(session, io, pool, volume_id.object_uuid)
            if record is None:
                return None
            header_id = record.image_id or _lookup_id(io, record.image_name)
            if not header_id:
                return None
            return Target(volume_id, pool, record, header_id)


def _decode(volume_id: str) -> VolumeId:
    try:
        return VolumeId.decode(volume_id)
    except MalformedId:
        raise NotFound(f"volume {volume_id!r} does not exist (not an id issued by this driver)") from None


def _lookup_id(io: Ioctx, name: str) -> str:
    try:
        return header_metadata.image_id(io, name)
    except NotFound:
        return ""


def _watchers(io: Ioctx, target: Target) -> list[str]:
    info = images.stat(io, target.record.image_name, with_watchers=True)
    return [str(w) for w in (info.watchers if info is not None else ())]


def _ledger_add(io: Ioctx, entries: dict[str, str]) -> None:
    if not omap.create_exclusive(io, FENCE_LEDGER, entries):
        omap.update(io, FENCE_LEDGER, entries)


class NodeDirectory(Protocol):
    """What the controller knows about nodes (Kubernetes, or the process's own node)."""

    def exists(self, node_id: str) -> bool | None:
        """Whether a node with this id runs the node plugin; None when this process cannot tell."""
        ...

    def out_of_service(self, node_id: str) -> bool:
        """Whether the node carries `node.kubernetes.io/out-of-service` (fence it on unpublish)."""
        ...


@dataclass(frozen=True)
class LocalNodes:
    """Without Kubernetes: the node ids this process serves itself (--mode=all), else none known."""

    own: frozenset[str] = frozenset()

    def exists(self, node_id: str) -> bool | None:
        return (node_id in self.own) if self.own else None

    def out_of_service(self, node_id: str) -> bool:
        return False
