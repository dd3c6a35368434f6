"""Which RBD image a node request is about: a volume this driver provisioned, or a static
(pre-provisioned) volume as ceph-csi documents them.

A static volume's id is the bare image name (`staticVolume: "true"` with clusterID and pool in
the volume attributes); nothing about it is journaled and the driver never deletes it.
The PV format: docs/design/node.md, "Which image".
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cephcsi.errors import InvalidArgument, NotFound
from cephcsi.observability.logging import fields
from cephcsi.volumes.parameters import parse_features
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)

STATIC_VOLUME_KEY = "staticVolume"
CTX_CLUSTER_ID = "clusterID"
CTX_POOL = "pool"
CTX_IMAGE = "imageName"
CTX_NAMESPACE = "radosNamespace"
CTX_FEATURES = "imageFeatures"

# Go's strconv.ParseBool, which ceph-csi uses for staticVolume: the same spellings mean the same.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# An image name we are willing to hand to the rbd tools: no pool/namespace separator, no
# snapshot separator, no whitespace or control characters, and no leading '-' (never an option).
_STATIC_IMAGE = re.compile(r"^[^\s/@\x00-\x1f\x7f-][^\s/@\x00-\x1f\x7f]{0,127}$")


@dataclass(frozen=True)
class VolumeSource:
    """Where a staged volume's image lives."""

    cluster_id: str
    pool: str
    image: str
    namespace: str | None
    """None: the cluster's rbd.radosNamespace from config.json."""
    static: bool


def is_static(context: Mapping[str, str]) -> bool:
    """The volume context marks a static volume. A value Go's ParseBool would not read is refused
    rather than taken as false (ceph-csi logs it and goes on, then fails with a less clear error)."""
    value = context.get(STATIC_VOLUME_KEY)
    if value is None or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise InvalidArgument(f'volume_context {STATIC_VOLUME_KEY}={value!r} is not a boolean; use "true" or "false"')


def static_image_name(volume_id: str) -> str:
    """The image named by a static volume's handle, or INVALID_ARGUMENT saying why it cannot be one."""
    if not _STATIC_IMAGE.match(volume_id):
        raise InvalidArgument(
            f"volume id {volume_id!r} of a static volume must be the bare RBD image name (no '/', '@', "
            "whitespace or leading '-'); put the pool in volumeAttributes.pool"
        )
    return volume_id


def resolve(volume_id: str, context: Mapping[str, str]) -> VolumeSource:
    """The image NodeStageVolume must map for this id and volume context."""
    if is_static(context):
        return _static(volume_id, context)
    volume = decode(volume_id)
    cluster_id = context.get(CTX_CLUSTER_ID) or volume.cluster_id
    if cluster_id != volume.cluster_id:
        raise InvalidArgument(
            f"volume_context clusterID {cluster_id!r} does not match the cluster in volume id {volume_id!r}"
        )
    return VolumeSource(
        cluster_id=cluster_id,
        pool=_required(context, CTX_POOL),
        image=_required(context, CTX_IMAGE),
        namespace=context.get(CTX_NAMESPACE),
        static=False,
    )


def check_known(volume_id: str, context: Mapping[str, str]) -> None:
    """NodePublishVolume: the id names a volume this node could have staged (else NOT_FOUND)."""
    if is_static(context):
        static_image_name(volume_id)
    else:
        decode(volume_id)


def is_issued(volume_id: str) -> bool:
    """The id has the form of an id this driver (or ceph-csi) issues."""
    try:
        VolumeId.decode(volume_id)
        return True
    except MalformedId:
        return False


def plausible_id(volume_id: str) -> bool:
    """Calls without a volume context (NodeGetVolumeStats): an id of ours, or a name a static
    volume could have. The path checks that follow decide whether the volume is really there."""
    try:
        VolumeId.decode(volume_id)
        return True
    except MalformedId:
        return bool(_STATIC_IMAGE.match(volume_id))


def decode(volume_id: str) -> VolumeId:
    try:
        return VolumeId.decode(volume_id)
    except MalformedId as error:
        raise NotFound(
            f"volume {volume_id!r} does not exist (not an id this driver issues: {error}); for a "
            f'pre-provisioned image set volumeAttributes {STATIC_VOLUME_KEY}: "true", clusterID and pool in the PV'
        ) from None


def _static(volume_id: str, context: Mapping[str, str]) -> VolumeSource:
    image = static_image_name(volume_id)
    cluster_id = context.get(CTX_CLUSTER_ID, "")
    if not cluster_id:
        raise InvalidArgument(
            f"static volume {volume_id!r}: volumeAttributes.clusterID is required (an entry of config.json)"
        )
    pool = context.get(CTX_POOL, "")
    if not pool:
        raise InvalidArgument(f"static volume {volume_id!r}: volumeAttributes.pool is required (the image's pool)")
    if CTX_FEATURES in context:
        parse_features(context[CTX_FEATURES])  # informational (the image exists), but a typo is worth reporting
    named = context.get(CTX_IMAGE)
    if named and named != image:
        # ceph-csi ignores imageName on static volumes (only in-tree migration uses it): so do we, loudly.
        log.warning(
            "static volume: volumeAttributes.imageName differs from the volume handle; the handle names the image",
            extra=fields(volume_id=volume_id, image_name=named),
        )
    return VolumeSource(cluster_id=cluster_id, pool=pool, image=image, namespace=context.get(CTX_NAMESPACE),
                        static=True)


def _required(context: Mapping[str, str], key: str) -> str:
    value = context.get(key, "")
    if not value:
        raise InvalidArgument(
            f"volume_context is missing {key} (it is set by this driver's CreateVolume; a statically "
            f'provisioned PV must set {STATIC_VOLUME_KEY}: "true", clusterID and pool in volumeAttributes)'
        )
    return value
