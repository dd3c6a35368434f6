"""A resumed stage's recovery from a device an earlier node plugin lost: an rbd-fuse loop device
stranded by a restart without a drain, or an rbd-nbd device whose daemon died for good. Each is
released so the stage maps afresh and the record never loses track of it — but not while the
volume is still mounted or published from it (FAILED_PRECONDITION: only an unstage may undo
that), nor while the healer may still re-attach the nbd device (ABORTED)."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from cephcsi.errors import FailedPrecondition, OperationInFlight
from cephcsi.node import mounts, stage_record
from cephcsi.node.mappers.base import Mapper
from cephcsi.node.mappers.fuse import FuseMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.stage_mounts import StagingMounts
from cephcsi.node.stage_record import StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


class DeviceRecovery:
    def __init__(self, mappers: Mapping[str, Mapper], mounter: mounts.Mounter,
                 read_mounts: Callable[[], list[mounts.MountEntry]], staging: StagingMounts) -> None:
        self.mappers = mappers
        self.mounter = mounter
        self.read_mounts = read_mounts
        self.staging = staging

    def release_stranded_loop(self, mapper: FuseMapper, record: StageRecord) -> None:
        """The recorded loop device is not found under the work dir: if it is still attached it
        reads a FUSE mount of a dead mount namespace (plugin restarted without a drain) and every
        I/O to it fails. Detach it before mapping afresh, so the record never loses track of
        it — unless the volume is still mounted from it, which only an unstage may undo."""
        if record.loop is None:
            return
        mounted_at = self.staging.mounted_from(record.loop.device, record)
        if mounted_at:
            raise FailedPrecondition(
                f"volume {record.volume_id} is still mounted at {mounted_at} from loop device {record.loop.device}, "
                "whose rbd-fuse mount is gone (the node plugin restarted without unstaging it), so its I/O fails. "
                "Stop the pods using the volume so that it is unpublished and unstaged, then it can be staged again"
            )
        mapper.unmap_recorded_loop(record)
        record.loop = None
        stage_record.save(record)

    def release_lost_device(self, record: StageRecord) -> None:
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
        if entry is None or not self.staging.mounted_from(record.device, record):
            return
        published = self.staging.publications(entry, table)
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
