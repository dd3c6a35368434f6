"""NodePublishVolume / NodeUnpublishVolume: bind the staged volume to a pod's target path.

Publish bind-mounts `<staging>/fs` (or its ceph-csi-encrypted directory) or `<staging>/block`
onto the target, read-only when asked; the mount table is the only state. Unpublish unmounts and
removes only an empty target, never one with content. A krbd volume's QoS becomes an io.max rule
after the bind (cephcsi.node.io_max). docs/design/node.md, "Publishing".
"""
from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from cephcsi.encryption.spec import FILE
from cephcsi.errors import AlreadyExists, FailedPrecondition, Internal
from cephcsi.node import legacy_stage, mounts, stage_record
from cephcsi.node.io_max import KrbdQos
from cephcsi.node.mappers.base import KRBD
from cephcsi.node.fscrypt import ioctls as fscrypt_ioctls, volume as fscrypt_volume
from cephcsi.node.requests import PublishRequest
from cephcsi.node.stage_record import ACCESS_BLOCK
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Staged:
    """What publish needs of a stage: ours (the stage record) or ceph-csi's (its mount)."""

    mount_path: str
    access_type: str
    read_only: bool
    file_encrypted: bool = False
    """fscrypt: the bind source is the encrypted directory in the mount, as in ceph-csi."""
    record: stage_record.StageRecord | None = None
    """Ours only (None for ceph-csi's stage)."""


class Publisher:
    def __init__(
        self,
        mounter: mounts.Mounter,
        kubelet_dir: str,
        read_mounts: Callable[[], list[mounts.MountEntry]] = mounts.read_mounts,
        krbd_qos: KrbdQos | None = None,
    ) -> None:
        self.mounter = mounter
        self.kubelet_dir = kubelet_dir
        self.read_mounts = read_mounts
        self.krbd_qos = krbd_qos

    def publish(self, request: PublishRequest) -> None:
        staged = self._staged(request)
        if staged.access_type != request.access.access_type:
            raise FailedPrecondition(
                f"volume {request.volume_id} is staged as {staged.access_type} but publish asks for "
                f"{request.access.access_type}; unstage and stage it with the same capability"
            )
        if staged.read_only and not request.access.read_only and not request.read_only:
            # Staged read-only (e.g. ReadOnlyMany on several nodes): a writer here would believe it
            # writes while the mount is read-only, and must not write anyway while others read.
            raise FailedPrecondition(
                f"volume {request.volume_id} is staged read-only at {request.staging_path} (a reader-only access "
                "mode); publishing it for writing is refused: use a reader-only access mode or readOnly: true"
            )
        table = self.read_mounts()
        anchor = mounts.top_mount(staged.mount_path, table)
        source = fscrypt_volume.encrypted_dir(staged.mount_path) if staged.file_encrypted else staged.mount_path
        if anchor is None:
            raise FailedPrecondition(
                f"volume {request.volume_id} is recorded as staged but {staged.mount_path} is not mounted; stage it again"
            )
        read_only = request.read_only or request.access.read_only or staged.read_only
        existing = mounts.top_mount(request.target_path, table)
        if existing is not None:
            self._check_existing(existing, anchor, read_only, request)
            self._limit_io(staged, request)  # a retry after a crash between the bind and the rule
            return
        if request.access.single_writer and not read_only:
            writers = [e.mount_point for e in self._publications(anchor, table) if not e.read_only]
            if writers:
                raise FailedPrecondition(
                    f"volume {request.volume_id} has access mode SINGLE_NODE_SINGLE_WRITER and is already published "
                    f"read-write at {', '.join(writers)}"
                )
        created = self._create_target(request.target_path, staged.access_type == ACCESS_BLOCK)
        try:
            self.mounter.bind(source, request.target_path, read_only=read_only, options=request.access.mount_flags)
        except Exception:
            if created:
                _remove_target(request.target_path)
            raise
        log.info(
            "published",
            extra=fields(volume_id=request.volume_id, target=request.target_path, read_only=read_only),
        )
        self._limit_io(staged, request)

    def _limit_io(self, staged: _Staged, request: PublishRequest) -> None:
        """krbd only: rbd-nbd and fuse map through librbd, which enforces the limits itself."""
        record = staged.record
        if self.krbd_qos is None or record is None or record.mapper != KRBD or not record.device:
            return
        self.krbd_qos.apply(request.volume_id, request.target_path, record.data_device, record.image_spec,
                            record.cluster_id, request.secrets, request.cluster_monitors)

    def _staged(self, request: PublishRequest) -> _Staged:
        record = stage_record.load(request.staging_path)
        if record is None:
            # Staged by ceph-csi before the switch (cephcsi.node.legacy_stage): publish from its mount.
            entry = legacy_stage.staged_mount(request.staging_path, request.volume_id, self.read_mounts())
            if entry is not None:
                path = legacy_stage.mount_path(request.staging_path, request.volume_id)
                # No volume context here: ceph-csi's file-encrypted stage is known by its directory.
                return _Staged(path, request.access.access_type, entry.read_only,
                               file_encrypted=_has_encrypted_dir(path))
        if record is None or record.volume_id != request.volume_id or not record.staged:
            raise FailedPrecondition(
                f"volume {request.volume_id} is not staged at {request.staging_path}; call NodeStageVolume first"
            )
        return _Staged(record.mount_path, record.access_type, record.read_only,
                       file_encrypted=record.encryption == FILE, record=record)

    @staticmethod
    def _check_existing(
        existing: mounts.MountEntry, anchor: mounts.MountEntry, read_only: bool, request: PublishRequest
    ) -> None:
        prefix = anchor.root.rstrip("/") + "/"
        same = (existing.major, existing.minor) == (anchor.major, anchor.minor) and (
            existing.root == anchor.root or existing.root.startswith(prefix)
        )
        if not same:
            raise AlreadyExists(
                f"target {request.target_path} already has another mount ({existing.source}); "
                "unpublish it or pick another target"
            )
        if existing.read_only != read_only:
            raise AlreadyExists(
                f"volume {request.volume_id} is already published at {request.target_path} "
                f"{'read-only' if existing.read_only else 'read-write'}; unpublish it to change that"
            )
        log.info("already published", extra=fields(volume_id=request.volume_id, target=request.target_path))

    def _publications(self, anchor: mounts.MountEntry, table: list[mounts.MountEntry]) -> list[mounts.MountEntry]:
        others = mounts.mounts_sharing(anchor, table)
        staging_root = os.path.dirname(anchor.mount_point).rstrip("/") + "/"
        others = [e for e in others if not e.mount_point.startswith(staging_root)]
        if self.kubelet_dir:
            root = os.path.realpath(self.kubelet_dir).rstrip("/") + "/"
            others = [e for e in others if e.mount_point.startswith(root)]
        return others

    @staticmethod
    def _create_target(path: str, block: bool) -> bool:
        """Create the target; True when this call created it (so a failed bind removes it)."""
        try:
            if block:
                if os.path.isdir(path):
                    raise FailedPrecondition(f"target {path} is a directory; a block volume needs a file path")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
                os.close(fd)
            else:
                if os.path.exists(path) and not os.path.isdir(path):
                    raise FailedPrecondition(f"target {path} exists and is not a directory")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.mkdir(path, 0o750)
        except FileExistsError:
            return False
        except OSError as error:
            raise Internal(f"cannot create target {path}: {error.strerror}") from None
        return True

    def unpublish(self, volume_id: str, target_path: str) -> None:
        if mounts.path_state(target_path) == "missing" and not mounts.is_mount_point(target_path):
            return
        self.mounter.unmount(target_path)
        _remove_target(target_path)
        log.info("unpublished", extra=fields(volume_id=volume_id, target=target_path))


def _remove_target(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.getsize(path) == 0 or not os.path.isfile(path):
            os.unlink(path)
        else:
            raise FailedPrecondition(f"target {path} is not mounted but holds data; left in place")
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno == errno.ENOTEMPTY:
            raise FailedPrecondition(
                f"target {path} is not a mount point but is not empty; left in place (move its files away)"
            ) from None
        raise Internal(f"cannot remove target {path}: {error.strerror}") from None


def _has_encrypted_dir(mount_path: str) -> bool:
    directory = fscrypt_volume.encrypted_dir(mount_path)
    try:
        return os.path.isdir(directory) and fscrypt_ioctls.get_policy(directory) is not None
    except (OSError, FailedPrecondition):
        return False
