"""`--repair`: fix what is provably this driver's and safe to fix, one finding at a time, each under
its entry's journal lock and after re-reading the state; what is gone by then is reported as
resolved. No repair destroys data. Design: docs/design/audit.md.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import rados
import rbd

from cephcsi.audit.model import Finding, Fix, JournalType, Kind, Outcome, Repair, Snapshot
from cephcsi.audit.scan import decode_deferment
from cephcsi.ceph import dependents, groups, image_create, image_metadata, images, imagestate, layering, omap, trash
from cephcsi.ceph.connection import Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.ceph.imagestate import ImageState, TrashState
from cephcsi.errors import CephCSIError, OperationInFlight
from cephcsi.observability.logging import fields
from cephcsi.volumes import split_journal
from cephcsi.volumes.journal import Hold, Journal

log = logging.getLogger(__name__)

# Order of work: debris and trash first, so a record's repair then finds its image gone or queued.
# Temporary snapshots first, while the entries that name the calls which left them still exist.
ORDER = (Fix.REMOVE_TEMP_SNAP, Fix.REMOVE_PARTIAL, Fix.LIST_IMAGE, Fix.FINISH_MOVE, Fix.PURGE, Fix.TRASH_ORPHAN, Fix.REMOVE_RECORD,
         Fix.RELEASE_KEY, Fix.RELEASE_SPLIT_KEY, Fix.COPY_METADATA, Fix.REMOVE_RBD_GROUP)


class _Resolved(Exception):
    """The re-check under the lock found the problem gone (or changed): nothing to do."""


class _Refused(Exception):
    """The re-check under the lock found a reason not to act."""


@dataclass
class RepairContext:
    session: Session
    io: rados.Ioctx
    pool: str
    journal: Journal
    snapshot: Snapshot
    inline: trash.InlinePurges
    allow_orphan_images: bool = False
    orphan_deferment_seconds: int = 7 * 24 * 3600
    snap_journal: Journal | None = None
    """The snapshot journal; None: snapshot findings are skipped."""
    group_journal: Journal | None = None
    """The group snapshot journal; None: group findings are skipped."""

    def journal_of(self, finding: Finding) -> Journal | None:
        """The journal whose lease guards the finding's entry (`finding.uuid`)."""
        if finding.journal is JournalType.GROUP:
            return self.group_journal
        return self.snap_journal if finding.journal is JournalType.SNAPSHOT else self.journal


def repair_all(ctx: RepairContext, findings: list[Finding]) -> list[Repair]:
    ordered = sorted(findings, key=lambda f: ORDER.index(f.fix) if f.fix is not None else len(ORDER))
    return [repair_one(ctx, finding) for finding in ordered]


def _precondition(ctx: RepairContext, finding: Finding) -> str:
    """Why this finding is not repaired at all, or ''."""
    if finding.fix is None:
        return finding.why_not or "report only"
    if not finding.ours:
        return "not this driver's image"
    if finding.fix is Fix.TRASH_ORPHAN and not ctx.allow_orphan_images:
        return "orphan images are moved to the trash only with --repair-orphan-images"
    if not finding.uuid:
        return "no journal uuid to lock the volume with"
    if ctx.journal_of(finding) is None:
        return "no journal to lock the entry with"
    return ""


def repair_one(ctx: RepairContext, finding: Finding) -> Repair:
    reason = _precondition(ctx, finding)
    if reason:
        return Repair(finding, Outcome.SKIPPED, reason)
    assert finding.fix is not None
    journal = ctx.journal_of(finding)
    assert journal is not None
    try:
        with _holding(ctx, journal, finding.uuid) as hold:
            action = ACTIONS[finding.fix](ctx, finding, hold)
        repair = Repair(finding, Outcome.REPAIRED, action)
    except _Resolved as why:
        repair = Repair(finding, Outcome.RESOLVED, str(why))
    except _Refused as why:
        repair = Repair(finding, Outcome.SKIPPED, str(why))
    except OperationInFlight as error:
        repair = Repair(finding, Outcome.SKIPPED, f"busy: {error}")
    except CephCSIError as error:
        repair = Repair(finding, Outcome.FAILED, str(error))
    (log.warning if repair.outcome is Outcome.FAILED else log.info)(
        "audit repair", extra=fields(kind=finding.kind.value, subject=finding.subject, uuid=finding.uuid,
                                     outcome=repair.outcome.value, action=repair.action))
    return repair


@contextmanager
def _holding(ctx: RepairContext, journal: Journal, uuid: str) -> Iterator[Hold]:
    with journal.locked(uuid) as hold:
        try:
            yield hold
        finally:
            # cls_lock created the record object if it was missing: leave no empty one behind
            # (an empty record reads as absent either way, so this changes no outcome).
            if omap.read(ctx.io, f"{journal.kind.record_prefix}{uuid}") == {}:
                journal.discard_orphan(uuid)


def _inspect(ctx: RepairContext, finding: Finding) -> ImageState:
    return imagestate.inspect(ctx.io, finding.image_name, finding.image_id)


def _take_out(ctx: RepairContext, state: ImageState) -> str:
    """Finish whatever a killed create/delete left of an image that is leaving: the same
    steps (and checks) DeleteVolume takes. Returns what was done."""
    if state.gone:
        return "image already gone"
    if state.partial_create:
        if images.remove_headerless(ctx.io, state.name) is not None:
            raise _Refused(f"image {state.name!r} turned out complete; not touched")
        return "removed the partial create"
    if state.trash is None:
        raise _Refused(f"image {state.name!r} is live or has a header but no name; not touched")
    if state.trash.state is TrashState.MOVING:
        if state.id_object:
            trash.require_unused(ctx.io, state.name)
        trash.move(ctx.io, state)
    if dependents.purged_by_librbd(ctx.io, state.image_id):
        return "finished the move of a clone parent to the trash; librbd purges it after its clones"
    trash.purge(ctx.session, ctx.io, ctx.pool, state.image_id, ctx.inline)
    return "finished the trash move and queued the purge" if state.trash.state is TrashState.MOVING \
        else "queued the trash purge"


def _remove_partial(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    state = _inspect(ctx, finding)
    if not state.partial_create:
        raise _Resolved("no longer a partial create")
    return _take_out(ctx, state)


def _list_image(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    state = _inspect(ctx, finding)
    if not state.unlisted:
        raise _Resolved("no longer a header and id object without a directory entry")
    images.list_unlisted(ctx.io, state.name, state.image_id)
    return "added the directory entry the killed create left out"


def _finish_trash(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    state = _inspect(ctx, finding)
    if state.trash is None:
        raise _Resolved("no longer in the trash")
    if state.trash.state is TrashState.RESTORING:
        raise _Refused("being restored from the trash")
    deferred = _deferred_until(ctx.io, state.image_id)
    if state.trash.state is TrashState.NORMAL and deferred > time.time():
        raise _Refused(f"deferred in the trash until {_utc(deferred)} on purpose")
    return _take_out(ctx, state)


def _journal(ctx: RepairContext, finding: Finding) -> Journal:
    journal = ctx.journal_of(finding)
    assert journal is not None  # checked by _precondition
    return journal


def _copy_metadata(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    journal = _journal(ctx, finding)
    record = journal.read(finding.uuid)
    pending = record.pending_metadata() if record is not None else {}
    if record is None or not pending:
        raise _Resolved("the record keeps no metadata any more")
    if not imagestate.inspect(ctx.io, record.image_name, record.image_id).live:
        raise _Refused(f"its image {record.image_name!r} is not live")
    image_metadata.ensure(ctx.io, record.image_name, pending)
    journal.forget_pending_metadata(record)
    return f"wrote {', '.join(sorted(pending))} to the image's metadata; removed them from the record"


def _remove_record(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    journal = _journal(ctx, finding)
    record = journal.read(finding.uuid)
    if record is None:
        return "removed the empty record object" if not finding.name else "record already gone"
    named = journal.lookup(record.name) == record.uuid
    if named and finding.kind is Kind.ORPHAN_RECORD:
        raise _Resolved("a name key points at the record now")
    planned = record.unjournaled_planned_id
    if planned and image_create.settle(ctx.io, record.image_name, planned):
        raise _Refused(f"its image {record.image_name!r} is complete (a killed create wrote it)")
    state = imagestate.inspect(ctx.io, record.image_name, record.image_id)
    if state.live:
        raise _Refused(f"its image {record.image_name!r} is live")
    done = _take_out(ctx, state)
    if named:
        journal.release_name(record.name, record.uuid)
    journal.remove_record(record.uuid)
    return f"{done}; removed the record{' and its name key' if named else ''}"


def _release_key(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    journal = _journal(ctx, finding)
    if journal.lookup(finding.name) != finding.uuid:
        raise _Resolved("the name key changed")
    if journal.read(finding.uuid) is not None:
        raise _Resolved("the record exists now")
    journal.release_unrecorded(finding.name, finding.uuid, hold)
    return "released the name key"


def _release_split_key(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    """A name key ceph-csi wrote for a volume in another pool, with nothing left behind it. ceph-csi
    reserves such a volume by creating csi.volume.<uuid> in the image pool before it writes the
    key, so while that object exists (a create may be in flight) the key stays."""
    journal = _journal(ctx, finding)
    raw = journal.lookup(finding.name) or ""
    try:
        value = split_journal.parse_name_value(raw, f"name key of {finding.name!r}") if raw else None
    except CephCSIError:
        value = None
    if value is None or value.uuid != finding.uuid or not value.elsewhere(ctx.io.get_pool_id()):
        raise _Resolved("the name key changed")
    if journal.read(finding.uuid) is not None:
        raise _Refused("its journal record is in this pool; inspect both pools")
    assert value.image_pool_id is not None  # elsewhere() says so
    image_pool = ctx.session.pool_name(value.image_pool_id)
    if image_pool is not None:
        obj = f"{journal.kind.record_prefix}{finding.uuid}"
        with ctx.session.ioctx(image_pool) as image_io:
            if omap.read(image_io, obj) is not None:
                raise _Refused(f"pool {image_pool!r} holds {obj}, with which ceph-csi reserves the volume "
                               "(a create may be in flight)")
    journal.release_name(finding.name, raw)
    return "released the name key" + (" (the pool it named is gone)" if image_pool is None else "")


def _trash_orphan(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    record = _journal(ctx, finding).read(finding.uuid)
    if record is not None and record.image_name == finding.image_name:
        raise _Resolved("the journal names the image now")
    state = imagestate.inspect(ctx.io, finding.image_name)
    if not state.live:
        raise _Resolved("no longer a live image")
    trash.require_unused(ctx.io, finding.image_name)
    if _has_clones(ctx.io, finding.image_name):
        raise _Refused("restored or cloned volumes read through it")
    with ceph_call("move orphan image to trash", f"image {finding.image_name!r}"):
        rbd.RBD().trash_move(ctx.io, finding.image_name, ctx.orphan_deferment_seconds)
    until = _utc(time.time() + ctx.orphan_deferment_seconds)
    return f"moved to the trash as id {state.image_id}; `rbd trash restore` brings it back (kept until {until})"


def _has_clones(io: rados.Ioctx, name: str) -> bool:
    with ceph_call("list clones", f"image {name!r}"):
        try:
            with rbd.Image(io, name, read_only=True) as image:
                return bool(layering.children_of(image))
        except rbd.ImageNotFound:
            return False


def _remove_temp_snap(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    """Under the volume's lease, which every call holds while its temporary snapshot exists:
    one found now belongs to a call that was killed (cephcsi.volumes.sources.sweep_temporaries)."""
    record = ctx.journal.read(finding.uuid)
    if record is None or record.image_name != finding.image_name:
        raise _Resolved("the volume's journal entry no longer names this image")
    if not finding.rbd_snapshot.startswith(layering.TEMP_SNAP_PREFIX):
        raise _Refused(f"{finding.rbd_snapshot!r} is not a temporary snapshot")
    with ceph_call("remove temporary snapshot", f"image {finding.image_name!r}"):
        try:
            with rbd.Image(ctx.io, finding.image_name) as image:
                if layering.user_snap(image, finding.rbd_snapshot) is None:
                    raise _Resolved("the temporary snapshot is gone")
                layering.remove_snap(image, finding.rbd_snapshot)
        except rbd.ImageNotFound:
            raise _Resolved("the volume's image is gone") from None
    return "removed the temporary snapshot (a clone made from it keeps it in the trash namespace while it needs it)"


def _remove_rbd_group(ctx: RepairContext, finding: Finding, hold: Hold) -> str:
    """Under the lease of the group record the group's name points at, which a create holds from
    before it makes the group to after it removes it: with no record there, no create can be
    using the group (it makes one only for a record it holds)."""
    if _journal(ctx, finding).read(finding.uuid) is not None:
        raise _Resolved("a group snapshot record names the group now")
    if not groups.group_exists(ctx.io, finding.subject):
        raise _Resolved("the RBD group is gone")
    groups.remove_group(ctx.io, finding.subject)
    return "removed the RBD group (its images left it, untouched, and its group snapshots went)"


def _deferred_until(io: rados.Ioctx, image_id: str) -> float:
    key = f"id_{image_id}"
    raw = (omap.read_raw(io, imagestate.TRASH, (key,)) or {}).get(key)
    return decode_deferment(raw) if raw else 0.0


def _utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


ACTIONS: dict[Fix, Callable[[RepairContext, Finding, Hold], str]] = {
    Fix.REMOVE_PARTIAL: _remove_partial,
    Fix.REMOVE_RBD_GROUP: _remove_rbd_group,
    Fix.LIST_IMAGE: _list_image,
    Fix.FINISH_MOVE: _finish_trash,
    Fix.PURGE: _finish_trash,
    Fix.REMOVE_RECORD: _remove_record,
    Fix.RELEASE_KEY: _release_key,
    Fix.RELEASE_SPLIT_KEY: _release_split_key,
    Fix.TRASH_ORPHAN: _trash_orphan,
    Fix.REMOVE_TEMP_SNAP: _remove_temp_snap,
    Fix.COPY_METADATA: _copy_metadata,
}
