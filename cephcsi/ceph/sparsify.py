"""The controller half of reclaiming space: librbd's sparsify (what `rbd sparsify` runs) on one
image, skipped while the image is in use, as ceph-csi's ControllerReclaimSpace does.

Sparsify reads every allocated object and deallocates the runs of zeros it finds (whole objects
are removed, shorter runs punched) in units of `sparse_size`; ceph-csi passes the image's object
size, so only whole zero objects go, which is cheap on the OSDs and never splits an object into
fragments. It does not know what a filesystem freed (that is the node's fstrim): it returns what
was written as zeros, or what a trim left zeroed but allocated.

Why not while in use: sparsify takes the image's exclusive lock, so a mapped client with
exclusive-lock loses it for the duration (its writes wait for the lock to come back) and
sparsify's reads race the client's writes for nothing — a watched image is being written, so its
zeros are not settled. A volume in use gets its space back from the node's trim instead. One
read-write open serves the check and the sparsify: that open is itself a watcher, so "in use"
means any watcher beyond ours (ceph-csi counts the same way); a client that maps the image after
the check waits for the lock like any other writer — slower, never wrong, since sparsify only
removes data that reads as zeros. The watchers are checked before anything is measured: the
usage is a walk over the whole image (a read of every object without fast-diff), which an image
that is then skipped would pay for nothing.

Usage before and after is measured as `rbd du` does for an image without snapshots: the extents
diff_iterate reports from the start of the image (whole objects, which the object map answers
without reading data when fast-diff is on).
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
