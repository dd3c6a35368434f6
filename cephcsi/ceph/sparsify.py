"""The controller half of reclaiming space: librbd's sparsify on one image, in units of its object
size, skipped while the image has a watcher beyond ours (as ceph-csi's ControllerReclaimSpace).
Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

from dataclasses import dataclass

import rados
import rbd

from cephcsi.ceph.errors import ceph_call


@dataclass(frozen=True)
class Sparsified:
    image: str
    in_use: bool
    """True: other clients watch the image, so it was left alone (and nothing was measured)."""
    used_before: int = 0
    used_after: int = 0
    encrypted: bool = False
    """True: the image holds an encrypted volume, so it was left alone (its caller decides)."""

    @property
    def reclaimed(self) -> int:
        return max(0, self.used_before - self.used_after)


def used_bytes(image: rbd.Image) -> int:
    """Bytes of the image's own objects that exist (rbd du's USED, without snapshots), in
    whole-object units."""
    total = 0

    def count(_offset: int, length: int, exists: bool) -> None:
        nonlocal total
        if exists:
            total += length

    image.diff_iterate(0, image.size(), None, count, include_parent=False, whole_object=True)
    return total


def sparsify(io: rados.Ioctx, name: str) -> Sparsified:
    """Sparsify image `name` unless other clients watch it. Raises the translated Ceph error
    (NotFound for a missing image)."""
    with ceph_call("sparsify", name), rbd.Image(io, name) as image:
        return sparsify_open(name, image)


def sparsify_open(name: str, image: rbd.Image) -> Sparsified:
    """sparsify() on an image opened read-write (whose own watch is one of its watchers)."""
    if len(list(image.watchers_list())) > 1:
        return Sparsified(name, in_use=True)
    before = used_bytes(image)
    image.sparsify(1 << image.stat()["order"])
    return Sparsified(name, in_use=False, used_before=before, used_after=used_bytes(image))
