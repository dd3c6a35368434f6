"""One writer per single-node volume: the `exclusive` map option.

Added by default for read-write maps of images with the exclusive-lock feature where the
mapper's `exclusive_by_default` says so (rbd-nbd yes, krbd and fuse no); a user's own
`exclusive` in mapOptions is passed as written. Why per mapper: docs/design/node.md.
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
