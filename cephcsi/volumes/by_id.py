"""Opening what a volume, snapshot or group snapshot id names: the id decoded, a session on its
cluster, its pool's ioctx, NotFound (the spec's answer) for an id this driver never issued or whose
pool is gone. One place for what the controller calls did each on their own."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from cephcsi.ceph.connection import ConnectionCache, Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.errors import NotFound
from cephcsi.locks import KeyLocks
from cephcsi.volumes.volume_id import MalformedId, VolumeId


@dataclass(frozen=True)
class Opened:
    session: Session
    pool: str
    io: Ioctx


def decode(text: str, what: str) -> VolumeId:
    """An id issued by this driver, or NotFound."""
    try:
        return VolumeId.decode(text)
    except MalformedId:
        raise NotFound(f"{what} {text!r} does not exist (not an id issued by this driver)") from None


@contextmanager
def pool_if_present(session: Session, entry_id: VolumeId) -> Iterator[tuple[str, Ioctx] | None]:
    """(pool name, ioctx) of the pool an id points into, or None when that pool is gone: for a
    caller to whom a missing pool means there is nothing to do (one lookup, no window between a
    check and the open)."""
    pool = session.pool_name(entry_id.pool_id)
    if pool is None:
        yield None
        return
    with session.ioctx(pool) as io:
        yield pool, io


def pool_gone(label: str) -> NotFound:
    return NotFound(f"{label} does not exist (its pool is gone)")


@contextmanager
def pool_of(session: Session, entry_id: VolumeId, label: str) -> Iterator[tuple[str, Ioctx]]:
    """(pool name, ioctx) of the pool an id points into; NotFound naming `label` when that pool
    is gone."""
    with pool_if_present(session, entry_id) as found:
        if found is None:
            raise pool_gone(label)
        yield found


@contextmanager
def opened(clusters: ClusterRegistry, connections: ConnectionCache, entry_id: VolumeId, label: str,
           credentials: Credentials, locks: KeyLocks | None = None, key: str = "") -> Iterator[Opened]:
    """Session and pool of a decoded id. With `locks`, `key` is held first and the session opened
    under it (the order the callers always had: an unknown cluster fails before either)."""
    cluster = clusters.get(entry_id.cluster_id)
    with ExitStack() as stack:
        if locks is not None:
            stack.enter_context(locks.hold(key))
        session = stack.enter_context(connections.session(cluster, credentials))
        pool, io = stack.enter_context(pool_of(session, entry_id, label))
        yield Opened(session, pool, io)
