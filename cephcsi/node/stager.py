"""NodeStageVolume / NodeUnstageVolume: map the image, make and mount its filesystem (or bind
its device), and undo all of it — restart-safe through the stage record.

Stage resumes after a crash and undoes what a failed attempt created; unstage checks the record
against the system (re-deriving it when lost) and refuses while the volume is still published.
docs/design/node.md, "Staging and its record".
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from cephcsi.config.read_affinity import ReadAffinity
from cephcsi.encryption.spec import BLOCK, FILE
from cephcsi.errors import AlreadyExists, FailedPrecondition, Internal, InvalidArgument, OperationInFlight
from cephcsi.node import devices, filesystems, legacy_stage, luks, mounts, rederive, stage_record
from cephcsi.node.encrypted_stage import LuksStage
from cephcsi.node.exec import Runner
from cephcsi.node.fscrypt.stage import FileStage
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.luks_keys import KeySource, KmsKeys
from cephcsi.node.mappers import options as map_options, read_affinity
from cephcsi.node.mappers.base import FUSE, KRBD, NBD, Mapper, MapRequest
from cephcsi.node.mappers.fuse import FuseMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mappers.select import MapperChoice
from cephcsi.node.requests import StageRequest
from cephcsi.node.stage_record import ACCESS_BLOCK, ACCESS_MOUNT, BLOCK_FILE, FS_DIR, StageRecord
from cephcsi.observability.logging import fields
from cephcsi.volumes import failpoints

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
        self.before_mount = before_mount
        # readAffinity: the node's CRUSH location (cephcsi.node.crush_location); None: never.
        self.crush_location = crush_location
        # Encrypted volumes (cephcsi.node.encrypted_stage): `keys` is built by the composition root
        # with the KMS configuration; without it, on first use with the default paths.
        self.crypt = luks_stage or LuksStage(luks.Luks(runner, command_timeout), self._default_keys, self._metadata)
        self._keys = keys
        self.files = FileStage(self._default_keys, self._metadata)

    def _default_keys(self) -> KeySource:
        if self._keys is None:
            self._keys = KmsKeys()
        return self._keys

    def _metadata(self, request: StageRequest) -> RbdImageMetadata:
        return RbdImageMetadata(self.run, self.timeout, request.image, request.monitors, request.credentials)

    # -- stage -----------------------------------------------------------------------------

    def stage(self, request: StageRequest) -> None:
        _check_encryption(request)
        self._ensure_staging_dir(request.staging_path)
        record = stage_record.load(request.staging_path)
        if record is not None:
            self._check_same_volume(record, request)
            if record.staged and self._intact(record):
                log.info("already staged", extra=fields(volume_id=request.volume_id, path=request.staging_path))
                return
            complete_before = record.staged
            if complete_before and record.mapper == NBD:
                self._release_lost_device(record)
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
            self._roll_back(record, created, everything=not complete_before)
            raise
        log.info(
            "staged",
            extra=fields(volume_id=request.volume_id, image=str(request.image), mapper=record.mapper, device=record.device),
        )

    def _ensure_staging_dir(self, path: str) -> None:
        # The CO creates it; being lenient costs nothing and helps manual testing.
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            raise InvalidArgument(f"staging_target_path {path} exists and is not a directory") from None
        except OSError as error:
            raise Internal(f"cannot create staging_target_path {path}: {error.strerror}") from None

    @staticmethod
    def _check_same_volume(record: StageRecord, request: StageRequest) -> None:
        if record.volume_id != request.volume_id:
            raise FailedPrecondition(
                f"staging path {request.staging_path} already holds volume {record.volume_id}; "
                f"unstage it before staging {request.volume_id} there"
            )
        access = request.access
        differences = []
        if record.access_type != access.access_type:
            differences.append(f"access type {record.access_type} vs {access.access_type}")
        if access.access_type == ACCESS_MOUNT and record.fs_type != access.fs_type:
            differences.append(f"fsType {record.fs_type} vs {access.fs_type}")
        if record.read_only != access.read_only:
            differences.append(f"read-only {record.read_only} vs {access.read_only}")
        if sorted(record.mount_flags) != sorted(access.mount_flags):
            differences.append(f"mount flags {record.mount_flags} vs {list(access.mount_flags)}")
        encryption = request.encryption.type if request.encryption is not None else ""
        if record.encryption != encryption:
            differences.append(f"encryption {record.encryption or 'none'} vs {encryption or 'none'}")
        if differences:
            raise AlreadyExists(
                f"volume {request.volume_id} is already staged at {request.staging_path} with a different "
                f"capability ({'; '.join(differences)}); unstage it first"
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
            crypt_name=luks.dm_name(request.volume_id) if _is(request, BLOCK) else "",
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
            self._release_stranded_loop(mapper, record)
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
            self._ensure_filesystem(record, request)
            self._ensure_fs_mount(record, created)
            # 3b. fscrypt: set up once, unlock (the record says file since the map)
            if request.encryption is not None and request.encryption.type == FILE:
                self.files.unlock(record, request, request.encryption)
        else:
            self._ensure_block_bind(record, created)
        if self.after_ready is not None:
            self.after_ready(record)
        record.staged = True
        stage_record.save(record)

    def _ensure_filesystem(self, record: StageRecord, request: StageRequest) -> None:
        if record.formatted:
            return
        if record.read_only:
            found = filesystems.probe(self.run, record.data_device, self.timeout)
            if found.fs_type != record.fs_type:
                raise FailedPrecondition(
                    f"read-only volume {record.volume_id} holds {found.fs_type or found.other or 'no filesystem'}, "
                    f"not {record.fs_type}; a read-only volume is never formatted"
                )
        else:

            def mkfs_starting(fs_uuid: str) -> None:
                record.mkfs_started = True
                record.mkfs_uuid = fs_uuid
                stage_record.save(record)

            # An interrupted mkfs never makes a resumed stage format again: the volume may have
            # been staged and filled elsewhere since. The probe alone decides (see filesystems).
            created = filesystems.ensure_filesystem(
                self.run,
                record.data_device,
                record.fs_type,
                request.mkfs_options,
                self.timeout,
                on_mkfs_start=mkfs_starting,
                interrupted_uuid=record.mkfs_uuid if record.mkfs_started else None,
                volume=record.volume_id,
                encrypt=record.encryption == FILE,
            )
            if created:
                failpoints.reach("node.after-mkfs")
        record.formatted = True
        record.mkfs_started = False
        stage_record.save(record)

    def _release_stranded_loop(self, mapper: FuseMapper, record: StageRecord) -> None:
        """The recorded loop device is not found under the work dir: if it is still attached it
        reads a FUSE mount of a dead mount namespace (plugin restarted without a drain) and every
        I/O to it fails. Detach it before mapping afresh, so the record never loses track of
        it — unless the volume is still mounted from it, which only an unstage may undo."""
        if record.loop is None:
            return
        mounted_at = self._mounted_from(record.loop.device, record)
        if mounted_at:
            raise FailedPrecondition(
                f"volume {record.volume_id} is still mounted at {mounted_at} from loop device {record.loop.device}, "
                "whose rbd-fuse mount is gone (the node plugin restarted without unstaging it), so its I/O fails. "
                "Stop the pods using the volume so that it is unpublished and unstaged, then it can be staged again"
            )
        mapper.unmap_recorded_loop(record)
        record.loop = None
        stage_record.save(record)

    def _release_lost_device(self, record: StageRecord) -> None:
        """A complete rbd-nbd stage whose device lost its daemon for good (the plugin restarted and
        the device could not be re-attached, cephcsi.node.nbd_healer): the staging mount reads a dead
        device, and a map afresh may even get the same /dev/nbdX, under which the old mount would
        look intact. Unmount it so the stage starts over from the map — unless pods still use it."""
        mapper = self.mappers[record.mapper]
        if not record.device or mapper.find(record) is not None:
            return
        if isinstance(mapper, NbdMapper) and mapper.reattach_pending(record.volume_id):
            raise OperationInFlight(
                f"the rbd-nbd device {record.device} of volume {record.volume_id} waits for the restarted plugin to "
                "re-attach it; retry shortly"
            )
        table = self.read_mounts()
        entry = mounts.top_mount(record.mount_path, table)
        if entry is None or not self._mounted_from(record.device, record):
            return
        published = self._publications(entry, table)
        if published:
            raise FailedPrecondition(
                f"volume {record.volume_id} lost its rbd-nbd device {record.device} (its daemon died with an earlier "
                f"node plugin and could not be re-attached), and it is still published at {', '.join(published)}, "
                "where its I/O fails. Restart the pods using it on this node: it is then unstaged and staged again"
            )
        log.warning("unmounting a staging mount whose rbd-nbd device is gone, to stage the volume again",
                    extra=fields(volume_id=record.volume_id, device=record.device, path=record.mount_path))
        self.mounter.unmount(record.mount_path)
        record.device = ""
        record.staged = False
        stage_record.save(record)

    def _mounted_from(self, device: str, record: StageRecord) -> str:
        """The record's mount path when the top mount there is `device`, else ''."""
        entry = mounts.top_mount(record.mount_path, self.read_mounts())
        if entry is None:
            return ""
        if record.access_type == ACCESS_BLOCK:
            return record.mount_path if _rdev(record.mount_path) == _rdev(device) and _rdev(device) is not None else ""
        try:
            return record.mount_path if (entry.major, entry.minor) == devices.device_numbers(device) else ""
        except OSError:
            return ""

    def _ensure_fs_mount(self, record: StageRecord, created: list[str]) -> None:
        target = record.mount_path
        entry = mounts.top_mount(target, self.read_mounts())
        major, minor = _device_numbers(record.data_device)
        if entry is not None:
            if (entry.major, entry.minor) != (major, minor):
                raise FailedPrecondition(
                    f"{target} has a mount of another device ({entry.source}); unmount it by hand, then retry"
                )
            return
        _mkdir(target)
        if self.before_mount is not None:
            self.before_mount(record)  # unmounted here, and mounted nowhere else (our stage)
        options = filesystems.mount_options(record.fs_type, record.mount_flags, record.read_only)
        self.mounter.mount(record.data_device, target, record.fs_type, options)
        created.append("mount")

    def _ensure_block_bind(self, record: StageRecord, created: list[str]) -> None:
        target = record.mount_path
        if mounts.is_mount_point(target, self.read_mounts()):
            if _rdev(target) != _rdev(record.data_device):
                raise FailedPrecondition(f"{target} has another device bound to it; unmount it by hand, then retry")
            return
        _touch(target)
        self.mounter.bind(record.data_device, target, read_only=record.read_only)
        created.append("mount")

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
            return _rdev(record.mount_path) == _rdev(device)
        try:
            return (entry.major, entry.minor) == devices.device_numbers(device)
        except OSError:
            return False

    def _roll_back(self, record: StageRecord, created: list[str], everything: bool) -> None:
        """Undo after a failed stage; failures here are logged, and the record is kept so a
        later unstage or stage can finish the job."""
        try:
            if everything:
                self._teardown(record)
                return
            if "mount" in created:
                if record.encryption == FILE:
                    self.files.lock(record)
                self.mounter.unmount(record.mount_path)
            if "open" in created:
                self.crypt.close(record)
            if "map" in created:
                self.mappers[record.mapper].unmap(record)
        except Exception as error:  # noqa: BLE001 - keep the original error for the caller
            log.error(
                "rolling back a failed stage failed; the stage record is kept for unstage",
                extra=fields(volume_id=record.volume_id, path=record.staging_path, error=str(error)),
            )

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
                _remove_leftovers(staging_path)
                return
        if record.volume_id != volume_id:
            raise FailedPrecondition(
                f"staging path {staging_path} holds volume {record.volume_id}, not {volume_id}; nothing was unstaged"
            )
        self._teardown(record)
        log.info("unstaged", extra=fields(volume_id=volume_id, path=staging_path, mapper=record.mapper))

    def _rederive(self, volume_id: str, staging_path: str) -> StageRecord | None:
        return rederive.record_from_system(self.mappers, self.read_mounts(), volume_id, staging_path,
                                           crypt_status=self.crypt.cryptsetup.status)

    def _teardown(self, record: StageRecord) -> None:
        table = self.read_mounts()
        entry = mounts.top_mount(record.mount_path, table)
        if entry is not None:
            published = self._publications(entry, table)
            if published:
                raise FailedPrecondition(
                    f"volume {record.volume_id} is still published at {', '.join(published)}; "
                    "unpublish it there before unstaging"
                )
            if record.encryption == FILE:
                self.files.lock(record)  # before the unmount, while the directory is reachable
            self.mounter.unmount(record.mount_path)
        self.crypt.close(record)  # before the unmap: the mapping holds the device open
        self.mappers[record.mapper].unmap(record)
        if os.path.isdir(record.staging_path):
            _remove_leftovers(record.staging_path)
            stage_record.remove(record.staging_path)

    def _publications(self, anchor: mounts.MountEntry, table: list[mounts.MountEntry]) -> list[str]:
        others = mounts.mounts_sharing(anchor, table)
        if self.kubelet_dir:
            # Only mounts of our namespace under the kubelet dir are publishes; a propagated copy
            # of the staging mount elsewhere (host bind of the kubelet dir) is not.
            root = os.path.realpath(self.kubelet_dir).rstrip("/") + "/"
            others = [e for e in others if e.mount_point.startswith(root)]
        staging_root = os.path.realpath(os.path.dirname(anchor.mount_point)).rstrip("/") + "/"
        return [e.mount_point for e in others if not e.mount_point.startswith(staging_root)]


def _is(request: StageRequest, kind: str) -> bool:
    return request.encryption is not None and request.encryption.type == kind


def _check_encryption(request: StageRequest) -> None:
    """ceph-csi's limits: file encryption needs a filesystem volume (a Block claim is refused,
    as ceph-csi refuses it) on ext4, the filesystem fscrypt works on here."""
    if not _is(request, FILE):
        return  # the type itself was validated with the volume context (encryption.spec)
    if request.access.block:
        raise InvalidArgument("encryptionType \"file\" (fscrypt) encrypts files in a filesystem; a Block volume "
                              "cannot use it: use encryptionType \"block\" for Block volumes")
    if request.access.fs_type != "ext4":
        raise InvalidArgument(f"encryptionType \"file\" (fscrypt) needs fsType ext4, not {request.access.fs_type!r}")


def _device_numbers(device: str) -> tuple[int, int]:
    try:
        return devices.device_numbers(device)
    except OSError as error:
        raise Internal(f"mapped device {device} disappeared before it could be mounted ({error.strerror}); retry") from None


def _rdev(path: str) -> int | None:
    try:
        return os.stat(path).st_rdev
    except OSError:
        return None


def _mkdir(path: str) -> None:
    try:
        os.mkdir(path, 0o750)
    except FileExistsError:
        if not os.path.isdir(path):
            raise FailedPrecondition(f"{path} exists and is not a directory; remove it and retry") from None
    except OSError as error:
        raise Internal(f"cannot create mount point {path}: {error.strerror}") from None


def _touch(path: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640)
        os.close(fd)
    except IsADirectoryError:
        raise FailedPrecondition(f"{path} exists and is a directory; a block volume needs a file there") from None
    except OSError as error:
        raise Internal(f"cannot create bind target {path}: {error.strerror}") from None


def _remove_leftovers(staging_path: str) -> None:
    """Remove our mount point dir/file under the staging path — only when nothing is mounted
    there, and never recursively (an unmounted fs dir should be empty; if not, keep it) — and
    temp files of a record write that a crash interrupted."""
    try:
        for name in os.listdir(staging_path):
            if name.startswith(stage_record.TMP_PREFIX) and name.endswith(".tmp"):
                os.unlink(os.path.join(staging_path, name))
    except OSError:
        pass
    for name in (FS_DIR, BLOCK_FILE):
        path = os.path.join(staging_path, name)
        if mounts.is_mount_point(path):
            raise Internal(f"{path} is still mounted after unmounting; inspect it by hand")
        mounts.remove_mount_point(path, "something wrote into the staging directory while the volume was not "
                                        "mounted. Move the files away and retry")
