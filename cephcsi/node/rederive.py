"""A stand-in stage record, rebuilt from the live system when the real one is missing.

NodeUnstageVolume must undo a stage whose record is gone (a staging directory wiped by hand, a
record lost with a node's disk): the staging mounts in /proc/self/mountinfo say which device
is mounted there, and the device says which mapper made it (a loop device over our fuse work
directory, an rbd or nbd device listed by `rbd device list`; for an encrypted volume, the device
under its LUKS mapping `luks-rbd-<volume id>`, which is then closed too). A device nothing
attributes to this volume is only unmounted, never unmapped (`NoMapper`).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

from cephcsi.errors import Internal
from cephcsi.node import luks, mounts
from cephcsi.node.mappers.base import FUSE, KRBD, NBD, Mapper, MapRequest
from cephcsi.node.mappers.rbd_cli import RbdDeviceMapper
from cephcsi.node.stage_record import ACCESS_BLOCK, ACCESS_MOUNT, BLOCK_FILE, FS_DIR, StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

NO_MAPPER = "none"


class NoMapper:
    """Stand-in for re-derived mounts whose device we cannot attribute: nothing to unmap."""

    name = NO_MAPPER

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        return ""

    def map(self, request: MapRequest) -> str:
        raise Internal("no mapper")

    def find(self, record: StageRecord) -> str | None:
        return None

    def unmap(self, record: StageRecord) -> None:
        return None


def record_from_system(mappers: Mapping[str, Mapper], table: Sequence[mounts.MountEntry], volume_id: str,
                       staging_path: str,
                       crypt_status: Callable[[str], luks.Status | None] | None = None) -> StageRecord | None:
    """The record of what `table` (the mount table) and the mappers show under `staging_path`,
    or None when nothing of the volume is left there. `crypt_status` reads a LUKS mapping's state
    (cephcsi.node.luks.Luks.status); None: encrypted volumes are not looked for."""
    fuse = mappers.get(FUSE)
    work_dir = fuse.work_dir_for(volume_id, staging_path) if fuse is not None else ""
    for access_type, name in ((ACCESS_MOUNT, FS_DIR), (ACCESS_BLOCK, BLOCK_FILE)):
        entry = mounts.top_mount(os.path.join(staging_path, name), table)
        if entry is None:
            continue
        device = entry.source if access_type == ACCESS_MOUNT else "/dev" + entry.root
        log.warning("stage record missing; re-derived from the mount table", extra=fields(device=device))
        crypt = _crypt_mapping(device, volume_id, crypt_status)
        if crypt is None:
            return _record_for_device(mappers, volume_id, staging_path, access_type, device, work_dir)
        record = _record_for_device(mappers, volume_id, staging_path, access_type, crypt.device, work_dir)
        record.crypt_name = crypt.name
        record.encryption = "block"
        return record
    if work_dir and os.path.isdir(work_dir):
        log.warning("stage record missing; found the fuse work directory", extra=fields(path=work_dir))
        return _bare_record(volume_id, staging_path, ACCESS_MOUNT, FUSE, "", work_dir)
    return None


def _record_for_device(mappers: Mapping[str, Mapper], volume_id: str, staging_path: str, access_type: str,
                       device: str, work_dir: str) -> StageRecord:
    name = os.path.basename(device)
    if name.startswith("loop") and work_dir:
        return _bare_record(volume_id, staging_path, access_type, FUSE, device, work_dir)
    for mapper_name, prefix in ((KRBD, "rbd"), (NBD, "nbd")):
        mapper = mappers.get(mapper_name)
        if name.startswith(prefix) and isinstance(mapper, RbdDeviceMapper):
            for item in mapper.mapped():
                if item.get("device") == device:
                    record = _bare_record(volume_id, staging_path, access_type, mapper_name, device, "")
                    record.pool = str(item.get("pool") or "")
                    record.namespace = str(item.get("namespace") or "")
                    record.image = mapper.listed_image(item)
                    return record
    # Unknown device: unmount only; never unmap something we cannot attribute to this volume.
    return _bare_record(volume_id, staging_path, access_type, "", device, "")


def _crypt_mapping(device: str, volume_id: str,
                   crypt_status: Callable[[str], luks.Status | None] | None) -> luks.Status | None:
    """The volume's open LUKS mapping when `device` (what is mounted or bound) is it."""
    if crypt_status is None:
        return None
    name = luks.dm_name(volume_id)
    number = _rdev(device)
    if os.path.basename(device) != name and (number is None or number != _rdev(luks.mapper_path(name))):
        return None
    status = crypt_status(name)
    return status if status is not None and status.device else None


def _rdev(path: str) -> int | None:
    try:
        return os.stat(path).st_rdev or None
    except OSError:
        return None


def _bare_record(volume_id: str, staging_path: str, access_type: str, mapper: str, device: str,
                 work_dir: str) -> StageRecord:
    return StageRecord(
        volume_id=volume_id,
        staging_path=staging_path,
        cluster_id="",
        pool="",
        image="",
        namespace="",
        mapper=mapper or NO_MAPPER,
        access_type=access_type,
        work_dir=work_dir,
        device=device,
    )
