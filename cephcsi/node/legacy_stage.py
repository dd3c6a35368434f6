"""Volumes that ceph-csi's node plugin staged, found on a node after the switch to cephcsi.

Such a stage (`<staging>/image-meta.json` beside `<staging>/<volume id>`) is unstaged the way
ceph-csi unstages it, published from, and taken as staged by NodeStageVolume, so the same
filesystem is never mounted twice. Layout and steps: docs/design/node.md, "Which image".
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cephcsi.errors import FailedPrecondition, Internal
from cephcsi.node import luks, mounts
from cephcsi.node.legacy_logs import apply_log_strategy
from cephcsi.node.mappers import options as map_options
from cephcsi.node.mappers.base import KRBD, NBD, Mapper
from cephcsi.node.stage_record import ACCESS_MOUNT, StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

STASH_NAME = "image-meta.json"


@dataclass(frozen=True)
class CephCsiStash:
    pool: str
    image: str
    namespace: str = ""
    unmap_options: str = ""
    nbd: bool = False
    encrypted: bool = False
    log_dir: str = ""
    log_strategy: str = ""


def mount_path(staging_path: str, volume_id: str) -> str:
    return os.path.join(staging_path, volume_id)


def load_stash(staging_path: str) -> CephCsiStash | None:
    path = os.path.join(staging_path, STASH_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as error:
        raise Internal(f"ceph-csi's stage stash {path} is unreadable ({error}); inspect the staging path by hand") from None
    if not isinstance(doc, dict) or not doc.get("pool") or not doc.get("image"):
        raise Internal(f"ceph-csi's stage stash {path} names no pool and image; inspect the staging path by hand")
    return CephCsiStash(
        pool=str(doc["pool"]), image=str(doc["image"]), namespace=str(doc.get("radosNamespace") or ""),
        unmap_options=str(doc.get("unmapOptions") or ""), nbd=doc.get("accessType") is True,
        encrypted=doc.get("encrypted") is True, log_dir=str(doc.get("logDir") or ""),
        log_strategy=str(doc.get("logFileStrategy") or ""),
    )


def present(staging_path: str, volume_id: str) -> bool:
    """ceph-csi left a stage of this volume here (its stash, or its mount point)."""
    return os.path.lexists(os.path.join(staging_path, STASH_NAME)) or os.path.lexists(mount_path(staging_path, volume_id))


def staged_mount(staging_path: str, volume_id: str, table: list[mounts.MountEntry]) -> mounts.MountEntry | None:
    """The mount ceph-csi made at `<staging>/<volume id>`, if it is there."""
    return mounts.top_mount(mount_path(staging_path, volume_id), table)


class LegacyUnstager:
    def __init__(self, mappers: Mapping[str, Mapper], mounter: mounts.Mounter, kubelet_dir: str,
                 read_mounts: Callable[[], list[mounts.MountEntry]] = mounts.read_mounts,
                 cryptsetup: luks.Luks | None = None) -> None:
        self.mappers = mappers
        self.cryptsetup = cryptsetup
        self.mounter = mounter
        self.kubelet_dir = kubelet_dir
        self.read_mounts = read_mounts

    def unstage(self, volume_id: str, staging_path: str) -> None:
        stash = load_stash(staging_path)
        if stash is not None and stash.encrypted and self.cryptsetup is None:
            raise FailedPrecondition(
                f"volume {volume_id} was staged by ceph-csi with LUKS encryption and this unstager cannot close "
                "its dm-crypt device; close it (cryptsetup close luks-rbd-<volume id>) and unmap it by hand"
            )
        target = mount_path(staging_path, volume_id)
        table = self.read_mounts()
        entry = mounts.top_mount(target, table)
        if entry is not None:
            published = self._publications(entry, table, staging_path)
            if published:
                raise FailedPrecondition(
                    f"volume {volume_id} is still published at {', '.join(published)}; unpublish it there before unstaging"
                )
            self.mounter.unmount(target)
        _remove_mount_point(target)
        if stash is not None:
            if stash.encrypted and self.cryptsetup is not None:
                self.cryptsetup.close(luks.dm_name(volume_id))  # it holds the device: before the unmap
            self._unmap(volume_id, staging_path, stash)
            os.unlink(os.path.join(staging_path, STASH_NAME))
        log.info("unstaged a volume staged by ceph-csi", extra=fields(volume_id=volume_id, path=staging_path))

    def _unmap(self, volume_id: str, staging_path: str, stash: CephCsiStash) -> None:
        mapper_name = NBD if stash.nbd else KRBD
        record = StageRecord(
            volume_id=volume_id, staging_path=staging_path, cluster_id="", pool=stash.pool, image=stash.image,
            namespace=stash.namespace, mapper=mapper_name, access_type=ACCESS_MOUNT,
            unmap_options=map_options.parse(stash.unmap_options, mapper_name, "unmapOptions"),
        )
        self.mappers[mapper_name].unmap(record)  # finds the device by image; nothing mapped is fine
        if stash.nbd:
            # Also when nothing was mapped any more (where ceph-csi skips it): a retry after a crash
            # between the unmap and this step must still handle the file, and no daemon writes it now.
            apply_log_strategy(volume_id, stash.log_dir, stash.log_strategy)

    def _publications(self, anchor: mounts.MountEntry, table: list[mounts.MountEntry], staging_path: str) -> list[str]:
        others = mounts.mounts_sharing(anchor, table)
        if self.kubelet_dir:
            root = os.path.realpath(self.kubelet_dir).rstrip("/") + "/"
            others = [e for e in others if e.mount_point.startswith(root)]
        staging_root = os.path.realpath(staging_path).rstrip("/") + "/"
        return [e.mount_point for e in others if not e.mount_point.startswith(staging_root)]


def _remove_mount_point(path: str) -> None:
    mounts.remove_mount_point(path, "move its files away and retry")
