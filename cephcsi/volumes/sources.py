"""Finding the volume or snapshot a new image is made from, and holding it still meanwhile (its
journal lease, held while a temporary snapshot exists on it). Design: docs/design/controller.md.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from cephcsi.ceph import image_access, layering
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.errors import NotFound, OperationInFlight
from cephcsi.observability.logging import fields
from cephcsi.volumes import by_id, split_journal
from cephcsi.volumes.by_id import decode as decode  # sources.decode: the name its callers use
from cephcsi.volumes.journal import SNAPSHOTS, VOLUMES, Journal, JournalKind, Record
from cephcsi.volumes.volume_id import VolumeId

log = logging.getLogger(__name__)

FINISHED_SIZE = "cephcsi.snap.size"
"""On a snapshot's record: its size in bytes, written with csi.imageid under the snapshot's lease
once its restore point exists. A restore takes its parent from the record then, instead of
opening the snapshot image (25 RADOS operations). ceph-csi's records, and cephcsi's from before
this key, lack it: the restore opens the image for them."""

SOURCE_WAIT_SECONDS = 5.0
"""How long a snapshot or clone waits for another one on the same source (each holds it for
~0.1-0.3 s): a burst of snapshots of one volume queues briefly instead of answering ABORTED."""


@dataclass(frozen=True)
class Entry:
    """A journal entry of a volume or snapshot, found from its id."""

    entry_id: VolumeId
    pool: str
    record: Record


@contextmanager
def opened(session: Session, entry_id: VolumeId, what: str) -> Iterator[tuple[str, Ioctx]]:
    """(pool name, ioctx) of the pool an id points into; NotFound when that pool is gone."""
    with by_id.pool_of(session, entry_id, f"{what} {entry_id.encode()!r}") as found:
        yield found


def read_entry(io: Ioctx, pool: str, entry_id: VolumeId, journal: Journal, what: str) -> Entry:
    record = journal.read(entry_id.object_uuid)
    if record is None:
        raise NotFound(f"{what} {entry_id.encode()!r} does not exist")
    return Entry(entry_id, pool, record)


def volume_journal(io: Ioctx, instance_id: str, lock_seconds: float, keeper: LeaseKeeper,
                   session: Session | None = None) -> Journal:
    """The volume journal of `io`'s pool; given the session, one that reads source volumes the
    way their snapshots and clones need them (`SourceJournal`)."""
    if session is None:
        return Journal(io, instance_id, VOLUMES, lock_seconds=lock_seconds, keeper=keeper)
    return SourceJournal(io, instance_id, lock_seconds, keeper, session)


class SourceJournal(Journal):
    """A journal as snapshot and clone calls read their source: a volume ceph-csi journaled apart
    from its image (cephcsi.volumes.split_journal) keeps its record in another pool, and so does a
    snapshot ceph-csi made of such a volume, while the lease, as the deletes take it, stays on
    this pool's object. Reads find the record wherever it is; everything else is the plain
    journal of this pool."""

    def __init__(self, io: Ioctx, instance_id: str, lock_seconds: float, keeper: LeaseKeeper,
                 session: Session, kind: JournalKind = VOLUMES) -> None:
        super().__init__(io, instance_id, kind, lock_seconds=lock_seconds, keeper=keeper)
        self.session = session

    def read(self, uuid: str) -> Record | None:
        record = super().read(uuid)
        if record is not None and not record.get(split_journal.JOURNAL_POOL):
            return record  # the usual case: no further read
        split = split_journal.locate(self.session, self.io, self.io.get_pool_name(), self.kind, uuid)
        return split.record if split is not None else record


def snapshot_journal(io: Ioctx, instance_id: str, lock_seconds: float, keeper: LeaseKeeper,
                     session: Session | None = None) -> Journal:
    """The snapshot journal of `io`'s pool; given the session, one that reads a source snapshot
    wherever ceph-csi journaled it (`SourceJournal`)."""
    if session is None:
        return Journal(io, instance_id, SNAPSHOTS, lock_seconds=lock_seconds, keeper=keeper)
    return SourceJournal(io, instance_id, lock_seconds, keeper, session, SNAPSHOTS)


@contextmanager
def hold_source(journal: Journal, uuid: str, wait: float = SOURCE_WAIT_SECONDS) -> Iterator[Record]:
    """Hold the source volume's journal lease (waiting up to `wait` for a concurrent snapshot
    or clone of it); yields its record. NotFound if the volume was deleted meanwhile."""
    deadline = time.monotonic() + wait
    while True:
        stack = ExitStack()
        try:
            stack.enter_context(journal.locked(uuid))
            break
        except OperationInFlight:
            stack.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
    with stack:
        record = journal.read(uuid)
        if record is None:
            # Our lease created an empty record object for a volume deleted meanwhile.
            journal.discard_orphan(uuid)
            raise NotFound(f"source volume (journal entry {uuid}) was deleted")
        yield record


def sweep_temporaries(image: image_access.Image, image_name: str, keep: str = "") -> None:
    """Remove temporary snapshots left by killed snapshot/clone calls (call under the source
    lease). One with a finished clone moves to the trash namespace, which the clone keeps."""
    for snap in layering.list_snaps(image):
        if snap.namespace == 0 and snap.name.startswith(layering.TEMP_SNAP_PREFIX) and snap.name != keep:
            log.warning("removing a temporary snapshot left by an interrupted call",
                        extra=fields(image=image_name, snapshot=snap.name))
            layering.remove_snap(image, snap.name)
