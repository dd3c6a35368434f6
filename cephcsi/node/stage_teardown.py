"""Undoing a stage. All of it (unstage, or a failed first stage): refused while the volume is
still published (FAILED_PRECONDITION); else the fscrypt key removed, the unmount, the LUKS close,
the unmap, then the staging path's leftovers, and the record last, so a crash anywhere leaves a
record naming what is left. Or, after a failed repair of a complete stage, only what that attempt
created; a failure there is logged and the record kept for a later unstage."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from cephcsi.encryption.spec import FILE
from cephcsi.errors import FailedPrecondition
from cephcsi.node import mounts, stage_record
from cephcsi.node.encrypted_stage import LuksStage
from cephcsi.node.fscrypt.stage import FileStage
from cephcsi.node.mappers.base import Mapper
from cephcsi.node.stage_mounts import StagingMounts
from cephcsi.node.stage_paths import remove_leftovers
from cephcsi.node.stage_record import StageRecord
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)


class StageTeardown:
    def __init__(self, mappers: Mapping[str, Mapper], mounter: mounts.Mounter,
                 read_mounts: Callable[[], list[mounts.MountEntry]], staging: StagingMounts,
                 crypt: LuksStage, files: FileStage) -> None:
        self.mappers = mappers
        self.mounter = mounter
        self.read_mounts = read_mounts
        self.staging = staging
        self.crypt = crypt
        self.files = files

    def undo(self, record: StageRecord) -> None:
        table = self.read_mounts()
        entry = mounts.top_mount(record.mount_path, table)
        if entry is not None:
            published = self.staging.publications(entry, table)
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
            remove_leftovers(record.staging_path)
            stage_record.remove(record.staging_path)

    def roll_back(self, record: StageRecord, created: list[str], everything: bool) -> None:
        """Undo after a failed stage; failures here are logged, and the record is kept so a
        later unstage or stage can finish the job."""
        try:
            if everything:
                self.undo(record)
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
