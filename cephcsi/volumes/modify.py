"""ControllerModifyVolume (a VolumeAttributesClass change) and the QoS steps of CreateVolume and
ControllerExpandVolume.

Validates the whole class before any Ceph call, writes only the metadata keys that differ
(a retry finishes a killed call; nothing is journaled), under the volume's in-process lock
(ABORTED when busy). Why: docs/design/controller.md, "volumes/modify.py".
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

from cephcsi.ceph import images
from cephcsi.ceph import qos as image_qos
from cephcsi.ceph.connection import Ioctx
from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import NotFound
from cephcsi.observability.logging import fields
from cephcsi.volumes import failpoints, qos
from cephcsi.volumes.journal import Record
from cephcsi.volumes.manager import VolumeManager

log = logging.getLogger(__name__)


def modify(volumes: VolumeManager, volume_id: str, mutable_parameters: Mapping[str, str],
           credentials: Credentials) -> None:
    """Make the volume's QoS what `mutable_parameters` (a VolumeAttributesClass's parameters,
    its whole QoS: limits it does not name are removed) describe."""
    policy = qos.parse(mutable_parameters)
    apply(volumes, volume_id, policy, credentials)


def create_policy(parameters: Mapping[str, str], mutable_parameters: Mapping[str, str]) -> qos.Policy:
    """CreateVolume's policy: the StorageClass's QoS keys, each overridden by the claim's
    VolumeAttributesClass (`mutable_parameters`) where both name it."""
    qos.parse(parameters, field="parameters", allow_other=True)
    qos.parse(mutable_parameters)
    merged = {**_canonical(qos.qos_keys(parameters)), **_canonical(mutable_parameters)}
    return qos.parse(merged, field="parameters and mutable_parameters")


def _canonical(parameters: Mapping[str, str]) -> dict[str, str]:
    return {qos.ALIASES.get(key, key): value for key, value in parameters.items()}


def apply(volumes: VolumeManager, volume_id: str, policy: qos.Policy, credentials: Credentials) -> None:
    with volumes.held(volume_id, credentials) as (io, record):
        info = images.stat(io, record.image_name)
        if info is None or not _apply_to(io, volume_id, record, policy, info.size):
            raise NotFound(f"volume {volume_id!r} does not exist (its image {record.image_name!r} is gone)")


def rescale(io: Ioctx, volume_id: str, record: Record, size: int) -> None:
    """After an expansion to `size` bytes: recompute the limits from the policy stored on the
    image. Run on every expand call, also a repeated one, so a crash between the resize and
    this step is repaired by the retry."""
    current = image_qos.read(io, record.image_name, record.image_id)
    if current is None:
        return
    policy = qos.stored(current)
    if policy.empty:
        return
    _write(io, volume_id, record, current, policy.metadata(size))


def _apply_to(io: Ioctx, volume_id: str, record: Record, policy: qos.Policy, size: int) -> bool:
    current = image_qos.read(io, record.image_name, record.image_id)
    if current is None:
        return False
    return _write(io, volume_id, record, current, policy.metadata(size))


def _write(io: Ioctx, volume_id: str, record: Record, current: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    changes = qos.changes(current, wanted)
    if not changes:
        log.info("volume QoS already as asked", extra=fields(volume_id=volume_id))
        return True
    done = image_qos.write(io, record.image_name, record.image_id, changes,
                           between=lambda key: failpoints.reach("modify.between-keys"))
    if done:
        log.info("volume QoS changed", extra=fields(volume_id=volume_id, set=sorted(k for k, v in changes.items() if v),
                                                    removed=sorted(k for k, v in changes.items() if v is None)))
    return done
