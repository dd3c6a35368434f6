"""Take an image out of service through the RBD trash, from whatever state a crash left; the purge
goes to the mgr, or runs inline for at most `inline_budget` seconds (then UNAVAILABLE, and the
retry joins it). Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field

import rados
import rbd

from cephcsi.ceph import encoding, images, imagestate, watcher_owners
from cephcsi.ceph.connection import Session
from cephcsi.ceph.errors import ceph_call
from cephcsi.ceph.imagestate import TRASH, ImageState, TrashState
from cephcsi.errors import CephCSIError, FailedPrecondition, Internal, Unavailable
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

WATCH_TIMEOUT_HINT = "osd_client_watch_timeout, 30 s by default"


def require_unused(io: rados.Ioctx, name: str, image_id: str = "") -> None:
    """Refuse to delete an image some client has open read-write (mapped on a node).

    By `image_id` when given: an image already (half-)moved to the trash has no name to open.
    A read-only open registers no watch, so this check is not its own watcher."""
    with ceph_call("list image watchers", f"image {name!r}"):
        try:
            opened = rbd.Image(io, image_id=image_id, read_only=True) if image_id else rbd.Image(io, name, read_only=True)
            with opened as image:
                watchers = list(image.watchers_list())
        except rbd.ImageNotFound:
            return
    if not watchers:
        return
    phrases, all_fenced = watcher_owners.describe(io, name, image_id or _image_id(io, name),
                                                  [dict(w) for w in watchers])
    described = ", ".join(phrases)
    if all_fenced:
        raise FailedPrecondition(
            f"image {name!r} is still watched by {described}: fenced clients (a node marked out of service); "
            f"the OSDs drop their watches within the watch timeout ({WATCH_TIMEOUT_HINT}) — nothing to do but "
            "retry, which the provisioner does by itself")
    raise FailedPrecondition(
        f"image {name!r} is open read-write by {len(watchers)} client(s): {described}. If the volume is "
        "mounted, delete the pods using it (or unmap it on that node) first. If that client crashed "
        f"(e.g. a driver or node process killed a moment ago), its watch expires after the OSD's watch "
        f"timeout ({WATCH_TIMEOUT_HINT}) and a retry then succeeds. If that node is lost for good, mark it "
        "out of service (docs/troubleshooting.md, Node loss): its clients are then blocklisted"
    )


def _image_id(io: rados.Ioctx, name: str) -> str:
    return images.lookup_id(io, name) or ""


def move(io: rados.Ioctx, state: ImageState) -> None:
    """Bring the image to a NORMAL (or REMOVING) trash entry: move it, or finish an
    interrupted move. librbd resumes a MOVING entry when asked to move the same name again,
    except the case handled here (see `_finish_move`)."""
    if state.trash is not None and state.trash.state is not TrashState.MOVING:
        return
    if state.unlisted:
        # librbd's move looks the name up in the directory and refuses one it lacks.
        images.list_unlisted(io, state.name, state.image_id)
    if state.trash is not None and state.trash.moved_by_remove and not state.directory:
        _finish_move(io, state)
        return
    with ceph_call("move image to trash", f"image {state.name!r}"):
        rbd.RBD().trash_move(io, state.name, 0)


def _finish_move(io: rados.Ioctx, state: ImageState) -> None:
    """Complete a move to the trash that `RBD.remove` began and a SIGKILL cut short after the
    image left the directory: a clone parent's (source USER_PARENT) or any image's that was
    being removed (source REMOVING; `images.remove_headerless`, `layering.remove_debris`, or an
    admin's `rbd rm`).

    librbd's move writes the trash entry (MOVING), removes the id object, then the directory
    entry, and only then flips the entry to NORMAL. Asked to move a name that is no longer in
    the directory, it looks for a MOVING entry of source USER only, so these entries can be
    resumed by neither `trash_move` nor `remove` (both answer ENOENT, checked against Ceph 16:
    a delete retried forever). The flip is all that is left, and no binding exposes it: this
    sends cls_rbd's `trash_state_set` (id, new state, expected state) itself. Until the entry is
    NORMAL librbd will not purge a parent after its last child, and the mgr will not remove
    the image."""
    log.warning("finishing an interrupted move to the trash",
                extra=fields(image=state.name, image_id=state.image_id, source=state.trash.source if state.trash else None))
    set_state(io, state.image_id, TrashState.NORMAL, expected=TrashState.MOVING)


def finish_removal(io: rados.Ioctx, name: str) -> bool:
    """Finish an `RBD.remove` of image `name` that was killed inside librbd. True if one was.

    librbd removes an image by way of the trash: it moves the image to a REMOVING entry, then
    deletes it. Killed in between, the image has left the directory and its name is free, so a
    retry that only looks under the name sees nothing to remove, goes on (a new image under the
    name, or the journal entry released) and the entry is never looked for again. Callers that
    removed debris by name, or take a name over from an attempt that may have, call this on
    that rare path, under the lease that keeps any other call of ours off the name: it reads
    the whole trash (one omap read). Only entries a removal already owns are touched (state
    REMOVING, or a move that `RBD.remove` began: source REMOVING), so nothing in them is kept."""
    leftovers = [entry for entry in imagestate.trash_entries(io)
                 if entry.name == name and (entry.state is TrashState.REMOVING
                                            or entry.source == imagestate.TRASH_SOURCE_REMOVING)]
    for entry in leftovers:
        log.warning("finishing the removal of an image a killed call left in the trash",
                    extra=fields(image=name, image_id=entry.image_id, state=entry.state.name))
        if entry.state is TrashState.MOVING:
            # librbd removes nothing whose move is unfinished (see `_finish_move`).
            set_state(io, entry.image_id, TrashState.NORMAL, expected=TrashState.MOVING)
        with ceph_call("finish an interrupted image removal", f"image {name!r} (id {entry.image_id})"):
            try:
                rbd.RBD().trash_remove(io, entry.image_id, force=True)
            except rbd.ImageNotFound:
                pass  # finished meanwhile (the mgr, or another retry)
    return bool(leftovers)


def set_state(io: rados.Ioctx, image_id: str, new: TrashState, expected: TrashState) -> None:
    """cls_rbd `trash_state_set`: the trash entry's state becomes `new` if it is `expected`."""
    request = encoding.string(image_id) + bytes((new.value, expected.value))
    with ceph_call("set the trash state", f"image id {image_id!r}"):
        io.execute(TRASH, "rbd", "trash_state_set", request)


@dataclass
class _Purge:
    """One inline removal: every call waiting on it reads its outcome from here."""

    thread: threading.Thread | None = None
    error: CephCSIError | None = None


@dataclass
class InlinePurges:
    """Inline trash removals still running, by image spec, so retries wait on the one
    removal instead of starting another."""

    budget_seconds: float = 20.0
    _running: dict[str, _Purge] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, session: Session, pool: str, namespace: str, image_id: str, spec: str) -> None:
        with self._lock:
            purge = self._running.get(spec)
            if purge is None:
                purge = _Purge()
                # The thread opens its own ioctx: the caller's closes when the call returns.
                purge.thread = threading.Thread(target=self._remove, args=(purge, session, pool, namespace, image_id, spec),
                                                name=f"purge-{image_id}", daemon=True)
                self._running[spec] = purge
                purge.thread.start()
        assert purge.thread is not None
        purge.thread.join(self.budget_seconds)
        if purge.thread.is_alive():
            raise Unavailable(
                f"purging trashed image {spec} is taking longer than {self.budget_seconds:g}s (the Ceph mgr refused "
                "the background task, so it runs in the driver); it continues in the background, retry later"
            )
        with self._lock:
            if self._running.get(spec) is purge:
                del self._running[spec]  # the next call for this image starts afresh
        if purge.error is not None:
            raise purge.error  # to every call that waited on this removal, not only the first

    @staticmethod
    def _remove(purge: _Purge, session: Session, pool: str, namespace: str, image_id: str, spec: str) -> None:
        try:
            with session.ioctx(pool, namespace) as io, ceph_call("remove image from trash", f"image {spec!r}"):
                try:
                    rbd.RBD().trash_remove(io, image_id, force=True)
                except rbd.ImageNotFound:
                    pass
        except CephCSIError as error:
            purge.error = error
        except Exception as error:  # noqa: BLE001 - reported to the waiting call, never lost in a thread
            purge.error = Internal(f"purging trashed image {spec} failed: {error}")


def purge(session: Session, io: rados.Ioctx, pool: str, image_id: str, inline: InlinePurges) -> None:
    """Queue the trashed image's removal with the mgr (which retries it, e.g. while a dead
    client's watch expires), or run it inline, bounded, if the mgr refuses."""
    namespace = io.get_namespace()
    spec = "/".join(part for part in (pool, namespace, image_id) if part)
    command = json.dumps({"prefix": "rbd task add trash remove", "image_id_spec": spec})
    try:
        ret, status = session.mgr_command(command)
    except CephCSIError as error:
        ret, status = -1, error.message
    if ret == 0:
        return
    log.info("mgr did not take the trash purge; removing inline", extra=fields(image_id=image_id, reason=status))
    inline.run(session, pool, namespace, image_id, spec)
