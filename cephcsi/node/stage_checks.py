"""The checks a NodeStageVolume request passes before anything on the node is touched: the
encryption its access allows (ceph-csi's limits, INVALID_ARGUMENT), and, at a staging path that
already has a stage record, the same volume (FAILED_PRECONDITION) with the same capability
(ALREADY_EXISTS). Pure: they read the request and the record only."""
from __future__ import annotations

from cephcsi.encryption.spec import FILE
from cephcsi.errors import AlreadyExists, FailedPrecondition, InvalidArgument
from cephcsi.node.requests import StageRequest
from cephcsi.node.stage_record import ACCESS_MOUNT, StageRecord


def encrypted_as(request: StageRequest, kind: str) -> bool:
    return request.encryption is not None and request.encryption.type == kind


def check_encryption(request: StageRequest) -> None:
    """ceph-csi's limits: file encryption needs a filesystem volume (a Block claim is refused,
    as ceph-csi refuses it) on ext4, the filesystem fscrypt works on here."""
    if not encrypted_as(request, FILE):
        return  # the type itself was validated with the volume context (encryption.spec)
    if request.access.block:
        raise InvalidArgument("encryptionType \"file\" (fscrypt) encrypts files in a filesystem; a Block volume "
                              "cannot use it: use encryptionType \"block\" for Block volumes")
    if request.access.fs_type != "ext4":
        raise InvalidArgument(f"encryptionType \"file\" (fscrypt) needs fsType ext4, not {request.access.fs_type!r}")


def check_same_volume(record: StageRecord, request: StageRequest) -> None:
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
