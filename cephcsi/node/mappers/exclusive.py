"""One writer per single-node volume: the `exclusive` map option.

Every read-write volume this driver serves is single-node (multi-node access is read-only,
cephcsi.csi.capabilities), so a second client writing the image while this node has it mapped
read-write can only be a mistake — a node that came back after its pods moved, a hand-run
`rbd map`, another cluster's driver — and two writers corrupt a filesystem. With `exclusive` the
mapping takes the image's exclusive lock when it maps and never hands it over: another client's
write fails (EROFS, "peer will not release lock" in its log) instead of interleaving with ours.
The lock goes with the unmap (or with the client, once Ceph blocklists a dead one).

Where it applies (the mapper's `exclusive_by_default`):
  * rbd-nbd (`--exclusive`): librbd owns the lock and still serves other clients' maintenance
    requests through it (resize, snapshot), so ControllerExpandVolume and snapshots of an
    in-use volume work as before.
  * krbd: not by default. The kernel client answers such requests "not supported", and librbd
    then asks for the lock, which an `exclusive` mapping refuses: `rbd resize` and `rbd snap create`
    of a mapped volume fail with EROFS (seen on Linux 6.1, tests/vm/test_exclusive_map.py), which
    would break online expansion and snapshots of in-use volumes. StorageClasses that prefer the
    guarantee set `mapOptions: "krbd:exclusive"`.
  * fuse: rbd-fuse has no such option; it opens the image as any librbd client, so writes of the
    two clients take turns with the lock (no corruption of RBD's own metadata, but of the filesystem).
Only images with the exclusive-lock feature have a lock to take (`imageFeatures` must list
exclusive-lock; the default, layering, has none), so the image's features are read first and
an image without the feature is mapped as before. A `mapOptions` list that names `exclusive`
itself is the user's choice and passed as written.
"""
from __future__ import annotations

import logging

from cephcsi.node.mappers.base import MapRequest
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

OPTION = "exclusive"
FEATURE = "exclusive-lock"


def wanted(single_writer: bool, read_only: bool, user_options: list[str]) -> bool:
    """Whether the driver adds `exclusive` itself: read-write single-node maps, unless the user's
    mapOptions already say `exclusive`."""
    return single_writer and not read_only and not any(o.split("=", 1)[0] == OPTION for o in user_options)


def possible(request: MapRequest, features: frozenset[str], mapper: str) -> bool:
    if FEATURE in features:
        return True
    log.info(
        "image has no exclusive-lock feature: mapped without 'exclusive', so another client could write it "
        "while this node has it (StorageClass imageFeatures with exclusive-lock enables the guard)",
        extra=fields(volume_id=request.volume_id, image=str(request.image), mapper=mapper),
    )
    return False
