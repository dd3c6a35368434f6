"""Which volume capabilities an RBD volume can honour, checked the same way by every RPC.

An RBD image is a block device with one writer at a time: a filesystem on it may be mounted
read-write on one node only, or read-only on many (MULTI_NODE_READER_ONLY); multi-node writing
is possible only as a raw block device, where coordinating writers is the application's job
(e.g. a clustered database).
"""
from __future__ import annotations

from collections.abc import Sequence

from cephcsi._generated import csi_pb2
from cephcsi.errors import InvalidArgument

Mode = csi_pb2.VolumeCapability.AccessMode

SUPPORTED_FS_TYPES = ("ext4", "xfs")
DEFAULT_FS_TYPE = "ext4"

SINGLE_NODE_MODES = frozenset(
    {Mode.SINGLE_NODE_WRITER, Mode.SINGLE_NODE_READER_ONLY, Mode.SINGLE_NODE_SINGLE_WRITER, Mode.SINGLE_NODE_MULTI_WRITER}
)
MULTI_NODE_MODES = frozenset({Mode.MULTI_NODE_READER_ONLY, Mode.MULTI_NODE_SINGLE_WRITER, Mode.MULTI_NODE_MULTI_WRITER})
READ_ONLY_MODES = frozenset({Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY})


def mode_name(mode: int) -> str:
    return Mode.Mode.Name(mode) if mode in Mode.Mode.values() else str(mode)


def check_well_formed(capability: csi_pb2.VolumeCapability, field: str) -> None:
    """Structural checks: a malformed capability is INVALID_ARGUMENT wherever it appears."""
    if capability.WhichOneof("access_type") is None:
        raise InvalidArgument(f"{field}: access_type must be set to block or mount")
    if not capability.HasField("access_mode") or capability.access_mode.mode == Mode.UNKNOWN:
        raise InvalidArgument(f"{field}: access_mode must be set")


def unsupported_reason(capability: csi_pb2.VolumeCapability) -> str | None:
    """None when the capability is supported, else why not (for messages)."""
    mode = capability.access_mode.mode
    if capability.HasField("mount"):
        fs_type = capability.mount.fs_type
        if fs_type and fs_type not in SUPPORTED_FS_TYPES:
            return f"filesystem {fs_type!r} is not supported (use {' or '.join(SUPPORTED_FS_TYPES)})"
        if mode in MULTI_NODE_MODES and mode != Mode.MULTI_NODE_READER_ONLY:
            # Many readers of one filesystem are safe when none writes (each node mounts it
            # read-only, without journal replay: see cephcsi.node.filesystems); writers are not.
            return (
                f"access mode {mode_name(mode)} needs a volume written from several nodes, which RBD supports "
                "only for block volumes (volumeMode: Block); a filesystem on RBD can be written on one node at a "
                "time (ReadOnlyMany, MULTI_NODE_READER_ONLY, is supported)"
            )
    if mode not in SINGLE_NODE_MODES | MULTI_NODE_MODES:
        return f"access mode {mode_name(mode)} is not supported"
    return None


def require_supported(capabilities: Sequence[csi_pb2.VolumeCapability], field: str = "volume_capabilities") -> None:
    """For calls that must honour every capability (CreateVolume, NodeStage, NodePublish)."""
    if not capabilities:
        raise InvalidArgument(f"{field} must name at least one capability")
    for index, capability in enumerate(capabilities):
        check_well_formed(capability, f"{field}[{index}]")
        reason = unsupported_reason(capability)
        if reason:
            raise InvalidArgument(f"{field}[{index}]: {reason}")
