"""ControllerExpandVolume's storage logic: grow a volume's image to the requested size (rounded up to
whole MiB as CreateVolume rounds), never shrink it. Idempotent and crash-safe; holds the volume's
KeyLocks (busy → ABORTED) and journal lease; an unknown id is NOT_FOUND. Design:
docs/design/controller.md.
"""
from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass

from cephcsi.ceph import resize
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption import volume_keys
from cephcsi.errors import Internal, InvalidArgument, NotFound, OutOfRange
from cephcsi.observability.logging import fields
from cephcsi.volumes import by_id, failpoints, modify
from cephcsi.volumes.capacity import MiB, choose_size
from cephcsi.volumes.journal import VOLUMES, Journal, Record
from cephcsi.volumes.manager import VolumeManager
from cephcsi.volumes.split_journal import JOURNAL_POOL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpandRequest:
    volume_id: str
    required_bytes: int
    limit_bytes: int
    credentials: Credentials


@dataclass(frozen=True)
class Expanded:
    size: int
    """Bytes the image has now."""
    grown: bool
    """False when the image already had the size (a repeated call)."""
    encrypted: bool = False
    """The volume's record names a KMS: a LUKS mapping on the node must grow too."""


def target_size(required: int, limit: int) -> int:
    """The size to grow to for a capacity range: `required` rounded up to whole MiB (as
    CreateVolume rounds), or, with only a limit, the largest whole MiB within it."""
    if required == 0 and limit == 0:
        raise InvalidArgument("capacity_range must set required_bytes (the new size of the volume)")
    if required == 0:
        if limit < 0:
            raise InvalidArgument("capacity_range: limit_bytes must not be negative")
        size = limit - limit % MiB
        if size == 0:
            raise OutOfRange(f"capacity_range: limit_bytes {limit} holds no whole MiB; RBD volumes are allocated in MiB")
        return size
    return choose_size(required, limit)


def check_current(volume_id: str, current: int, target: int, limit: int) -> bool:
    """Whether the image must grow. An image already at `target` or larger needs nothing (the
    call is a repeat, or asked for less than there is) unless a limit excludes its size: that
    would need a shrink, which this driver never does."""
    if current < target:
        return True
    if limit and current > limit:
        raise OutOfRange(
            f"volume {volume_id} already has {current} bytes, more than limit_bytes {limit}; RBD volumes are "
            "never shrunk (data beyond the new end would be lost). Request at least the current size"
        )
    return False


def expand(volumes: VolumeManager, request: ExpandRequest) -> Expanded:
    """Grow the volume to the requested range; NotFound for a volume that does not exist."""
    volume_id = by_id.decode(request.volume_id, "volume")
    target = target_size(request.required_bytes, request.limit_bytes)
    with by_id.opened(volumes.clusters, volumes.connections, volume_id, f"volume {request.volume_id!r}",
                      request.credentials, volumes.id_locks, request.volume_id) as at:
        session, pool, io = at.session, at.pool, at.io
        journal = Journal(io, volumes.instance_id, VOLUMES, lock_seconds=volumes.journal_lock_seconds,
                          keeper=volumes.keeper)
        uuid = volume_id.object_uuid
        try:
            # The lease only if the record object exists (else cls_lock would create one for
            # any well-formed id that names nothing), and the record read in the same round
            # trip.
            return _expand_held(volumes, session, io, pool, journal, uuid, request, target, existing=True)
        except _NoRecordObject:
            pass
        # The record may be in another pool (a volume ceph-csi journaled apart from its image,
        # cephcsi.volumes.split_journal) with no object in this one yet; the lock is always on
        # this pool's object.
        if volumes.read_record(session, io, pool, uuid) is None:
            raise NotFound(f"volume {request.volume_id!r} does not exist")
        return _expand_held(volumes, session, io, pool, journal, uuid, request, target, existing=False)


class _NoRecordObject(Exception):
    """The volume's record object does not exist in the pool its id names."""


def _expand_held(volumes: VolumeManager, session: Session, io: Ioctx, pool: str, journal: Journal, uuid: str,
                 request: ExpandRequest, target: int, existing: bool) -> Expanded:
    """Under the volume's lease: find its record, then grow its image."""
    with ExitStack() as stack:
        try:
            hold = stack.enter_context(journal.locked(uuid, read=True, existing=existing))
        except NotFound:
            raise _NoRecordObject() from None
        record = hold.found
        if record is None or record.get(JOURNAL_POOL):
            # No record here, or one whose name key is in another pool: look where ceph-csi
            # keeps split records.
            record = volumes.read_record(session, io, pool, uuid)
        if record is None:
            if not existing:
                # Deleted since our read: the lease re-created an empty record object, which
                # nothing points at.
                journal.discard_orphan(uuid)
            raise NotFound(f"volume {request.volume_id!r} does not exist")
        return _grow_locked(io, request, record, target)


def _grow_locked(io: Ioctx, request: ExpandRequest, record: Record, target: int) -> Expanded:
    def needed(current: int) -> bool:
        return check_current(request.volume_id, current, target, request.limit_bytes)

    try:
        grown = resize.grow(io, record.image_name, target, expected_id=record.image_id, needed=needed)
    except resize.ForeignImage as error:
        raise Internal(
            f"image {record.image_name!r} has id {error.found}, but the journal of volume {request.volume_id} "
            f"records {record.image_id}; run `cephcsi audit` before expanding it"
        ) from None
    if grown is None:
        raise NotFound(f"volume {request.volume_id!r} does not exist (its image {record.image_name!r} is gone)")
    if not grown.changed:
        log.info("volume already has the requested size", extra=fields(volume_id=request.volume_id, bytes=grown.after))
        # Also on a repeat: the call that grew the image may have died before this step.
        modify.rescale(io, request.volume_id, record, grown.after)
        return Expanded(grown.after, grown=False, encrypted=_encrypted(record))
    failpoints.reach("expand.after-resize")
    modify.rescale(io, request.volume_id, record, grown.after)
    log.info(
        "volume expanded",
        extra=fields(volume_id=request.volume_id, image=record.image_name, before=grown.before, after=grown.after),
    )
    return Expanded(grown.after, grown=True, encrypted=_encrypted(record))


def _encrypted(record: Record) -> bool:
    return bool(record.get(volume_keys.RECORD_KMS_KEY))
