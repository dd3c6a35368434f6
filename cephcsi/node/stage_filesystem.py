"""The filesystem step of a stage. A read-only volume must already hold the requested filesystem
and is never formatted (FAILED_PRECONDITION otherwise); a writable one is formatted only when
the probe finds the device empty, with the mkfs start and its UUID saved in the stage record
first, so that a resumed stage never formats a volume twice (cephcsi.node.filesystems)."""
from __future__ import annotations

from cephcsi.encryption.spec import FILE
from cephcsi.errors import FailedPrecondition
from cephcsi.node import filesystems, stage_record
from cephcsi.node.exec import Runner
from cephcsi.node.requests import StageRequest
from cephcsi.node.stage_record import StageRecord
from cephcsi.volumes import failpoints


def ensure(run: Runner, timeout: float, record: StageRecord, request: StageRequest) -> None:
    if record.formatted:
        return
    if record.read_only:
        found = filesystems.probe(run, record.data_device, timeout)
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
            run,
            record.data_device,
            record.fs_type,
            request.mkfs_options,
            timeout,
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
