"""Raw librbd steps for section 8: the floor of a CSI group snapshot as the driver cuts it (an RBD
group, one group snapshot, each member copied at that instant into an image with a snapshot, the
group removed), and of its deletion; no journal, leases or checks."""
from __future__ import annotations

import uuid

import rbd

from bench.raw import RawRbd


class RawGroups:
    def __init__(self, raw: RawRbd) -> None:
        self.raw = raw

    def group_snapshot(self, images: list[str], copy: bool) -> list[str]:
        """One crash-consistent instant across `images`; with `copy`, each member's content at it
        copied into a new image with a snapshot (the copies' names are returned)."""
        io, tag = self.raw.io, uuid.uuid4().hex[:10]
        group_name = f"bench-group-{tag}"
        self.raw.rbd.group_create(io, group_name)
        group = rbd.Group(io, group_name)
        for name in images:
            group.add_image(io, name)
        group.create_snap(group_name)
        copies = []
        if copy:
            for index, name in enumerate(images):
                target = f"bench-group-copy-{tag}-{index}"
                with rbd.Image(io, name, read_only=True) as image:
                    image.set_snap_by_id(_group_snap_id(image))
                    image.copy(io, target, features=rbd.RBD_FEATURE_LAYERING)
                with rbd.Image(io, target) as copied:
                    copied.create_snap(target)
                copies.append(target)
        group.remove_snap(group_name)
        for name in images:
            group.remove_image(io, name)
        self.raw.rbd.group_remove(io, group_name)
        return copies

    def delete_copies(self, copies: list[str]) -> None:
        """What deleting each member snapshot does on Ceph: its snapshot removed, the image to the
        trash and its purge handed to the mgr."""
        for name in copies:
            with rbd.Image(self.raw.io, name) as image:
                for snap in list(image.list_snaps()):
                    image.remove_snap(snap["name"])
                image_id = str(image.id())
            self.raw.trash_move_mgr_purge((name, image_id))

    def remove_members(self, images: list[str]) -> None:
        for name in images:
            self.raw.remove(name)


def _group_snap_id(image: rbd.Image) -> int:
    """The image's snapshot of its (only) group snapshot: how a member's point is found."""
    for snap in image.list_snaps():
        if int(snap.get("namespace", 0)) == rbd.RBD_SNAP_NAMESPACE_TYPE_GROUP:
            return int(snap["id"])
    raise LookupError("the image has no group snapshot")
