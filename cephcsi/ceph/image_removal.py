"""Taking a volume's image out of service from whatever state an earlier, killed attempt left it in
(cephcsi.ceph.imagestate). The caller holds the volume's journal lease and journals the image id
when told, before anything moves the image. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

from cephcsi.ceph import dependents, groups, image_access, image_ensure, images, imagestate, trash
from cephcsi.ceph.connection import Ioctx, Session
from cephcsi.ceph.errors import error_number
from cephcsi.errors import FailedPrecondition, Internal


@dataclass(frozen=True)
class Target:
    """What the journal knows of the image."""

    name: str
    journaled_id: str
    """The image id in the record ('' when none is journaled)."""
    planned_id: str
    """The id a hand-written create planned and no release journaled yet ('' when none)."""


@dataclass(frozen=True)
class Steps:
    """What the caller does between the Ceph steps."""

    journal_id: Callable[[str], None]
    """Journal this image id (the image is found under it, and the record lacks it)."""
    after_trash: Callable[[], None] = lambda: None
    """Right after the image is in the trash (a failpoint for the crash tests)."""


def take_out(session: Session, io: Ioctx, pool: str, target: Target, steps: Steps,
             inline: trash.InlinePurges) -> None:
    """Move the image to the trash and queue its purge (or leave a clone parent for librbd to
    purge after its children); nothing when it is gone already. Idempotent: a retry after a
    kill anywhere in here resumes from what it finds."""
    known_id = target.journaled_id
    planned = target.planned_id
    if planned and image_ensure.settle_planned(io, target.name, planned):
        # A create killed before its release: the image it wrote is complete (else what it
        # wrote is gone now).
        known_id = planned
    inspection = imagestate.Inspection(io, target.name, known_id)
    # Whether a live image has users or snapshots is checked while the inspection's reads
    # are in flight, and used only once they say the image is live (and, for the header
    # probe, that its id is the journaled one): by two reads of the header when the id is
    # journaled, else by a read-only open, which the header probe also falls back to when
    # the image turns out watched or snapshotted.
    header_probe = dependents.HeaderProbe(io, known_id) if known_id else None
    mover = image_access.TrashMover(session, io, known_id)
    usage = dependents.probe(io, target.name) if header_probe is None else None
    state = inspection.result()
    if header_probe is not None and state.image_id == header_probe.image_id:
        usage = header_probe.usage()
    unused_by_header = usage is not None and header_probe is not None
    if state.image_id and state.image_id != target.journaled_id:
        # Journal the id before anything moves the image: once it leaves the directory the
        # id is the only way to find it.
        steps.journal_id(state.image_id)
    if state.gone:
        return
    if state.partial_create:
        complete = images.remove_headerless(io, target.name)
        if complete is None:
            return
        # A complete image under the name after all, with an id the journal lacks (a create
        # killed after its header, or its last operations landing late): journaled, then
        # taken out like any live image.
        steps.journal_id(complete.image_id)
        state = imagestate.inspect(io, target.name, complete.image_id)
    if state.trash is None and not state.live:
        raise Internal(
            f"image {target.name!r} (id {state.image_id}) has a header but no name or trash entry; "
            "run `cephcsi audit` to inspect it"
        )
    if state.live:
        snaps = dependents.require_unused(io, target.name, usage)
        # Snapshots or clones still read through it: librbd purges it after them.
        if dependents.defer_if_parent(io, state, snaps):
            return
    # Which path moves it (by hand or librbd) is TrashMover's choice; a move by hand rests on
    # what the header probe proved (no watcher, no snapshot).
    try:
        mover.move(state, proven_unused=unused_by_header)
    except FailedPrecondition as error:
        # librbd's EMLINK: a member of an RBD group; the driver's own temporary group of an
        # abandoned group snapshot create is left, then the move is tried once more.
        if error.__cause__ is None or error_number(error.__cause__) != errno.EMLINK or not state.live \
                or not groups.leave_temporary_group(io, target.name):
            raise
        mover.move(state, proven_unused=unused_by_header)
    steps.after_trash()
    if not state.live:
        # Resuming a delete that a crash interrupted, perhaps inside librbd with the image
        # open: its dead watch would make the mgr's purge fail and back off for minutes.
        # Answer FAILED_PRECONDITION instead until the watch expires; the retry then queues
        # a purge that succeeds at once. (A live image was checked before the move.)
        trash.require_unused(io, target.name, state.image_id)
    # A live image was just moved by trash_move (source USER): only a resumed move can have
    # left a parent's entry that librbd purges itself.
    if not state.live and dependents.purged_by_librbd(io, state.image_id):
        return
    trash.purge(session, io, pool, state.image_id, inline)
