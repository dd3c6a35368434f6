"""RBD groups and group snapshots: the one crash-consistent instant across several images, and
a member copied out at its group snapshot (`copy_at`, which works from Pacific on; clone from a
group snapshot needs Squid). Every step is idempotent (an existing group, member or snapshot
counts as done). Why copy, and what each release offers: docs/design/ceph-access.md."""
from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph import images
from cephcsi.ceph.errors import ceph_call, error_number
from cephcsi.errors import FailedPrecondition


@dataclass(frozen=True)
class MemberPoint:
    """One member's snapshot in a group snapshot."""

    snap_id: int
    timestamp: float


def _is(error: BaseException, number: int) -> bool:
    return error_number(error) == number


def ensure_group(io: rados.Ioctx, group: str) -> None:
    with ceph_call("create RBD group", f"group {group!r}"):
        try:
            rbd.RBD().group_create(io, group)
        except (rbd.ImageExists, rbd.Error) as error:
            if not isinstance(error, rbd.ImageExists) and not _is(error, errno.EEXIST):
                raise


def group_exists(io: rados.Ioctx, group: str) -> bool:
    with ceph_call("list RBD groups", f"pool {io.get_pool_name()!r}"):
        return group in list(rbd.RBD().group_list(io))


def member_group(io: rados.Ioctx, image_name: str) -> str:
    """The name of the group image `image_name` belongs to ('' for none)."""
    with ceph_call("read the group of image", f"image {image_name!r}"), rbd.Image(io, image_name, read_only=True) as image:
        return str(image.group().get("name") or "")


def add_member(io: rados.Ioctx, group: str, image_name: str) -> None:
    """Add the image to `group`; one already there is fine, one in another group is refused
    (an image belongs to at most one RBD group)."""
    current = member_group(io, image_name)
    if current == group:
        return
    if current:
        raise FailedPrecondition(
            f"image {image_name!r} is in RBD group {current!r}; an image can belong to one group only: "
            "remove it from that group (rbd group image remove) before a group snapshot")
    with ceph_call("add image to RBD group", f"image {image_name!r} → group {group!r}"):
        try:
            rbd.Group(io, group).add_image(io, image_name)
        except rbd.Error as error:
            if not _is(error, errno.EEXIST):
                raise


GROUP_SNAP_COMPLETE = 1
"""rbd_group_snap_state_t: INCOMPLETE (0) while librbd is still taking it, or after it was killed
doing so; COMPLETE (1) once every member has its snapshot."""


def create_group_snap(io: rados.Ioctx, group: str, snap: str) -> None:
    """Take group snapshot `snap` unless it is complete already; one left incomplete by a killed
    librbd call is removed and taken again (no member was copied from it: the caller copies
    only from a complete one)."""
    with ceph_call("create RBD group snapshot", f"group {group!r} snapshot {snap!r}"):
        state = _group_snap_states(io, group).get(snap)
        if state == GROUP_SNAP_COMPLETE:
            return
        if state is not None:
            rbd.Group(io, group).remove_snap(snap)
        rbd.Group(io, group).create_snap(snap)


def _group_snap_states(io: rados.Ioctx, group: str) -> dict[str, int]:
    # Looked up first: Tentacle's binding aborts the process (free(): invalid pointer) when
    # Group.list_snaps meets a missing group instead of raising ImageNotFound.
    if group not in rbd.RBD().group_list(io):
        return {}
    try:
        return {str(s["name"]): int(s["state"]) for s in rbd.Group(io, group).list_snaps()}
    except rbd.ImageNotFound:
        return {}


def group_snap_complete(io: rados.Ioctx, group: str, snap: str) -> bool:
    """Whether the group's snapshot `snap` exists and is complete (False when the group is gone)."""
    with ceph_call("list RBD group snapshots", f"group {group!r}"):
        return _group_snap_states(io, group).get(snap) == GROUP_SNAP_COMPLETE


def member_point(io: rados.Ioctx, image_name: str, group: str, snap: str) -> MemberPoint | None:
    """The image's snapshot of group snapshot `group`@`snap` (None if it has none)."""
    pool_id = io.get_pool_id()
    with ceph_call("find group snapshot of image", f"image {image_name!r}"), \
            rbd.Image(io, image_name, read_only=True) as image:
        for found in image.list_snaps():
            snap_id = int(found["id"])
            if int(found.get("namespace", 0)) != rbd.RBD_SNAP_NAMESPACE_TYPE_GROUP:
                continue
            info = image.snap_get_group_namespace(snap_id)
            if str(info.get("name")) == group and str(info.get("snap_name")) == snap and \
                    int(info.get("pool", pool_id)) == pool_id:
                return MemberPoint(snap_id, float(image.get_snap_timestamp(snap_id).timestamp()))
    return None


def copy_at(io: rados.Ioctx, image_name: str, snap_id: int, target: str,
            pool_name: Callable[[int], str | None]) -> None:
    """Copy image `image_name` as it was at snapshot `snap_id` into new image `target`, with the
    source's features and data pool (`pool_name` resolves its id). The caller removes a partial
    target first."""
    with ceph_call("copy group snapshot point", f"image {image_name!r} → {target!r}"), \
            rbd.Image(io, image_name, read_only=True) as image:
        features = int(image.features()) | images.FEATURE_BITS["layering"]
        data_pool_id = int(image.data_pool_id())
        data_pool = None if data_pool_id in (-1, io.get_pool_id()) else pool_name(data_pool_id)
        image.set_snap_by_id(snap_id)
        image.copy(io, target, features=features, data_pool=data_pool)


def remove_group_snap(io: rados.Ioctx, group: str, snap: str) -> None:
    with ceph_call("remove RBD group snapshot", f"group {group!r} snapshot {snap!r}"):
        try:
            rbd.Group(io, group).remove_snap(snap)
        except rbd.Error as error:
            if not _is(error, errno.ENOENT):
                raise


def remove_group(io: rados.Ioctx, group: str) -> None:
    """Remove the group: its members leave it and its snapshots go (group gone counts as removed)."""
    with ceph_call("remove RBD group", f"group {group!r}"):
        if group not in rbd.RBD().group_list(io):
            return  # (and Tentacle's binding aborts on list_snaps of a missing group)
        try:
            handle = rbd.Group(io, group)
            for snap in list(handle.list_snaps()):
                remove_group_snap(io, group, str(snap["name"]))
            for member in list(handle.list_images()):
                try:
                    handle.remove_image(io, str(member["name"]))
                except rbd.Error as error:
                    if not _is(error, errno.ENOENT):
                        raise
            rbd.RBD().group_remove(io, group)
        except rbd.Error as error:
            if not _is(error, errno.ENOENT):
                raise


TEMPORARY_GROUP_PREFIX = "csi-vol-group-"
"""The default name prefix of the RBD group a CreateVolumeGroupSnapshot makes for its instant
(volumes.group_snapshots' `groupNamePrefix` default)."""


def leave_temporary_group(io: rados.Ioctx, image_name: str) -> bool:
    """Take the image out of the driver's temporary RBD group, for DeleteVolume of a source a
    killed and abandoned group snapshot create left in it (newer librbd refuses to move a group
    member to the trash). True when it left one. Safe: a running create holds the source's journal
    lease, which DeleteVolume holds now, and a retry of that create re-adds what it needs. Another
    group is the user's: the caller's FAILED_PRECONDITION stands."""
    group = member_group(io, image_name)
    if not group.startswith(TEMPORARY_GROUP_PREFIX):
        return False
    with ceph_call("leave RBD group", f"image {image_name!r} group {group!r}"):
        rbd.Group(io, group).remove_image(io, image_name)
    return True
