"""NodeStageVolume / NodeUnstageVolume: map the image, make and mount its filesystem (or bind
its device), and undo all of it — restart-safe through the stage record.

Stage resumes after a crash (stage_checks, device_recovery) and undoes what a failed attempt
created; unstage checks the record against the system (re-deriving it when lost) and refuses
while the volume is still published (stage_teardown). The steps' pieces: stage_filesystem,
stage_mounts, stage_paths. docs/design/node.md, "Staging and its record".
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from cephcsi.config.read_affinity import ReadAffinity
from cephcsi.encryption.spec import BLOCK, FILE
from cephcsi.errors import FailedPrecondition, OperationInFlight
from cephcsi.node import devices, legacy_stage, luks, mounts, rederive, stage_filesystem, stage_record
from cephcsi.node.device_recovery import DeviceRecovery
from cephcsi.node.encrypted_stage import LuksStage
from cephcsi.node.exec import Runner
from cephcsi.node.fscrypt.stage import FileStage
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.luks_keys import KeySource, KmsKeys
from cephcsi.node.mappers import options as map_options, read_affinity
from cephcsi.node.mappers.base import FUSE, KRBD, NBD, Mapper, MapRequest
from cephcsi.node.mappers.fuse import FuseMapper
from cephcsi.node.mappers.select import MapperChoice
from cephcsi.node.requests import StageRequest
from cephcsi.node.stage_checks import check_encryption, check_same_volume, encrypted_as
from cephcsi.node.stage_mounts import StagingMounts, rdev
from cephcsi.node.stage_paths import ensure_staging_dir, remove_leftovers
from cephcsi.node.stage_record import ACCESS_BLOCK, ACCESS_MOUNT, StageRecord
from cephcsi.node.stage_teardown import StageTeardown
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


class Stager:
    def __init__(
        self,
        mappers: Mapping[str, Mapper],
        choice: MapperChoice,
        mounter: mounts.Mounter,
        runner: Runner,
        command_timeout: float,
        kubelet_dir: str,
        read_mounts: Callable[[], list[mounts.MountEntry]] = mounts.read_mounts,
        after_ready: Callable[[StageRecord], None] | None = None,
        before_mount: Callable[[StageRecord], None] | None = None,
        crush_location: Callable[[ReadAffinity], read_affinity.CrushLocation] | None = None,
        luks_stage: LuksStage | None = None,
        keys: KeySource | None = None,
    ) -> None:
        self.mappers: dict[str, Mapper] = {**mappers, rederive.NO_MAPPER: rederive.NoMapper()}
        self.choice = choice
        self.mounter = mounter
        self.run = runner
        self.timeout = command_timeout
        self.kubelet_dir = kubelet_dir
        self.read_mounts = read_mounts
        # Resize-on-stage (cephcsi.node.expander): the image may have grown while unstaged.
        self.after_ready = after_ready
        # readAffinity: the node's CRUSH location (cephcsi.node.crush_location); None: never.
        self.crush_location = crush_location
        # Encrypted volumes (cephcsi.node.encrypted_stage): `keys` is built by the composition root
        # with the KMS configuration; without it, on first use with the default paths.
        self.crypt = luks_stage or LuksStage(luks.Luks(runner, command_timeout), self._default_keys, self._metadata)
        self._keys = keys
        self.files = FileStage(self._default_keys, self._metadata)
        self.staging = StagingMounts(mounter, read_mounts, kubelet_dir, before_mount)
        self.recovery = DeviceRecovery(self.mappers, mounter, read_mounts, self.staging)
        self.teardown = StageTeardown(self.mappers, mounter, read_mounts, self.staging, self.crypt, self.files)

    def _default_keys(self) -> KeySource:
        if self._keys is None:
            self._keys = KmsKeys()
        return self._keys

    def _metadata(self, request: StageRequest) -> RbdImageMetadata:
        return RbdImageMetadata(self.run, self.timeout, request.image, request.monitors, request.credentials)

    # -- stage -----------------------------------------------------------------------------

    def stage(self, request: StageRequest) -> None:
        check_encryption(request)
        ensure_staging_dir(request.staging_path)
        record = stage_record.load(request.staging_path)
        if record is not None:
            check_same_volume(record, request)
            if record.staged and self._intact(record):
                log.info("already staged", extra=fields(volume_id=request.volume_id, path=request.staging_path))
                return
            complete_before = record.staged
            if complete_before and record.mapper == NBD:
                self.recovery.release_lost_device(record)
            log.info("resuming an incomplete stage", extra=fields(volume_id=request.volume_id, mapper=record.mapper))
        elif legacy_stage.staged_mount(request.staging_path, request.volume_id, self.read_mounts()) is not None:
            # ceph-csi staged it here before the switch (a kubelet restart re-stages): it is staged.
            log.info("already staged by ceph-csi", extra=fields(volume_id=request.volume_id, path=request.staging_path))
            return
        else:
            record = self._new_record(request)
            complete_before = False
        created: list[str] = []
        try:
            self._stage_steps(record, request, created)
        except OperationInFlight:
            # The device is claimed by a holder still at work (devices.require_unclaimed): tearing the
            # mapping down under it helps nobody; the retry uses it, the record lets unstage undo it.
            raise
        except Exception:
            self.teardown.roll_back(record, created, everything=not complete_before)
            raise
        log.info(
            "staged",
            extra=fields(volume_id=request.volume_id, image=str(request.image), mapper=record.mapper, device=record.device),
        )

    def _new_record(self, request: StageRequest) -> StageRecord:
        mapper_name = self.choice.for_volume(request.mounter)
        mapper = self.mappers[mapper_name]
        return StageRecord(
            volume_id=request.volume_id,
            staging_path=request.staging_path,
            cluster_id=request.cluster_id,
            pool=request.image.pool,
            image=request.image.image,
            namespace=request.image.namespace,
            mapper=mapper_name,
            access_type=request.access.access_type,
            fs_type=request.access.fs_type if not request.access.block else "",
            read_only=request.access.read_only,
            mount_flags=list(request.access.mount_flags),
            unmap_options=map_options.parse(request.unmap_options, mapper_name, "unmapOptions"),
            work_dir=mapper.work_dir_for(request.volume_id, request.staging_path),
            encryption=request.encryption.type if request.encryption is not None else "",
            crypt_name=luks.dm_name(request.volume_id) if encrypted_as(request, BLOCK) else "",
        )

    def _crush_location(self, record: StageRecord, request: StageRequest,
                        options: list[str]) -> read_affinity.CrushLocation:
        """Only krbd maps with read affinity (as in ceph-csi); the Node's labels are not even
        read when another mapper maps or the StorageClass set read placement itself."""
        if self.crush_location is None or record.mapper != KRBD or not request.read_affinity.enabled or \
                read_affinity.user_decides(options):
            return ()
        return self.crush_location(request.read_affinity)

    def _stage_steps(self, record: StageRecord, request: StageRequest, created: list[str]) -> None:
        mapper = self.mappers[record.mapper]
        options = map_options.parse(request.map_options, record.mapper, "mapOptions")
        if options and record.mapper == FUSE:
            log.warning("mapOptions do not apply to the fuse mapper; ignored", extra=fields(options=options))
            options = []
        # 1. map (record first: it names the mapper and its work dir, enough to undo a crash mid-map)
        stage_record.save(record)
        device = mapper.find(record)
        if device is None and isinstance(mapper, FuseMapper) and record.loop is not None:
            self.recovery.release_stranded_loop(mapper, record)
        if device is None:
            device = mapper.map(
                MapRequest(
                    volume_id=record.volume_id,
                    image=record.image_spec,
                    monitors=request.monitors,
                    credentials=request.credentials,
                    options=options,
                    read_only=record.read_only,
                    work_dir=record.work_dir,
                    crush_location=self._crush_location(record, request, options),
                    # Every read-write volume is single-node (multi-node access is read-only).
                    exclusive=not record.read_only,
                )
            )
            created.append("map")
        loop = mapper.loop_backing(device) if isinstance(mapper, FuseMapper) else None
        if record.device != device or record.loop != loop:
            # Saved before anything uses the device: after a restart without a drain, this is
            # all that still ties the loop device to this volume (see LoopBacking).
            record.device = device
            record.loop = loop
            stage_record.save(record)
        # 1b. LUKS: format once, open (the record named the mapping before the map)
        if request.encryption is not None and request.encryption.type == BLOCK and \
                self.crypt.open(record, request, request.encryption):
            created.append("open")
        # 2. filesystem, 3. mount
        if record.access_type == ACCESS_MOUNT:
            # Neither probe-and-format nor mount while a command a killed plugin left running
            # (mkfs, an offline resize2fs) still claims the device.
            devices.require_unclaimed(record.data_device)
            stage_filesystem.ensure(self.run, self.timeout, record, request)
            self.staging.ensure_fs_mount(record, created)
            # 3b. fscrypt: set up once, unlock (the record says file since the map)
            if request.encryption is not None and request.encryption.type == FILE:
                self.files.unlock(record, request, request.encryption)
        else:
            self.staging.ensure_block_bind(record, created)
        if self.after_ready is not None:
            self.after_ready(record)
        record.staged = True
        stage_record.save(record)

    def _intact(self, record: StageRecord) -> bool:
        """A complete stage whose mount and mapping are both still there."""
        entry = mounts.top_mount(record.mount_path, self.read_mounts())
        if entry is None:
            return False
        device = self.mappers[record.mapper].find(record)
        if device is None:
            return False
        if record.crypt_name:
            # The mapping over the device: the mount compares with it (it is gone when closed).
            active = self.crypt.cryptsetup.status(record.crypt_name)
            if active is None or active.device != device:
                return False
            device = record.data_device
        if record.encryption == FILE and not self.files.unlocked(record):
            return False  # the key left the keyring (removed by hand): the stage unlocks it again
        if record.access_type == ACCESS_BLOCK:
            return rdev(record.mount_path) == rdev(device)
        try:
            return (entry.major, entry.minor) == devices.device_numbers(device)
        except OSError:
            return False

    # -- unstage ---------------------------------------------------------------------------

    def unstage(self, volume_id: str, staging_path: str) -> None:
        if not os.path.isdir(staging_path):
            record = self._rederive(volume_id, staging_path)
            if record is None:
                return
        else:
            record = stage_record.load(staging_path)
            if record is None and legacy_stage.present(staging_path, volume_id):
                legacy_stage.LegacyUnstager(self.mappers, self.mounter, self.kubelet_dir, self.read_mounts,
                                            self.crypt.cryptsetup).unstage(volume_id, staging_path)
                return
            record = record or self._rederive(volume_id, staging_path)
            if record is None:
                remove_leftovers(staging_path)
                return
        if record.volume_id != volume_id:
            raise FailedPrecondition(
                f"staging path {staging_path} holds volume {record.volume_id}, not {volume_id}; nothing was unstaged"
            )
        self.teardown.undo(record)
        log.info("unstaged", extra=fields(volume_id=volume_id, path=staging_path, mapper=record.mapper))

    def _rederive(self, volume_id: str, staging_path: str) -> StageRecord | None:
        return rederive.record_from_system(self.mappers, self.read_mounts(), volume_id, staging_path,
                                           crypt_status=self.crypt.cryptsetup.status)
