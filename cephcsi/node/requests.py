"""Domain requests of the node service: what csi/node.py extracts from the protobuf messages,
already validated, so the node layer never sees protobuf."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.config.read_affinity import DISABLED, ReadAffinity
from cephcsi.node.stage_record import ACCESS_BLOCK, ACCESS_MOUNT, ImageSpec


@dataclass(frozen=True)
class VolumeAccess:
    access_type: str
    """mount | block."""
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()
    read_only: bool = False
    """The access mode is a reader-only mode: map, mount and publish read-only."""
    single_writer: bool = False
    """SINGLE_NODE_SINGLE_WRITER: at most one read-write publish at a time."""

    def __post_init__(self) -> None:
        if self.access_type not in (ACCESS_MOUNT, ACCESS_BLOCK):
            raise ValueError(f"access_type {self.access_type!r}")

    @property
    def block(self) -> bool:
        return self.access_type == ACCESS_BLOCK


@dataclass(frozen=True)
class StageRequest:
    volume_id: str
    staging_path: str
    cluster_id: str
    monitors: str
    image: ImageSpec
    credentials: Credentials = field(repr=False)
    access: VolumeAccess
    mounter: str = ""
    """From the volume context; '' means the node default (--mounter)."""
    map_options: str = ""
    unmap_options: str = ""
    mkfs_options: str = ""
    read_affinity: ReadAffinity = DISABLED
    """The cluster's config.json readAffinity: krbd maps from the nearest replica when active."""
    encryption: EncryptionSpec | None = None
    """From the volume context (ceph-csi's keys); None: not encrypted."""
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The stage secret as the CO sent it: the KMS may need more of it than the cephx user
    (the default KMS's encryptionPassphrase)."""


@dataclass(frozen=True)
class PublishRequest:
    volume_id: str
    staging_path: str
    target_path: str
    access: VolumeAccess
    read_only: bool = False
    """The request's `readonly` flag (e.g. a pod's readOnly volume mount)."""
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """The node-publish secret as the CO sent it, when the StorageClass names one. Only a krbd
    volume's QoS step reads a cephx user from it (cephcsi.node.io_max); any other volume
    publishes whatever it holds, as it did before krbd QoS."""
    cluster_monitors: Callable[[str], str] | None = field(default=None, repr=False, compare=False)
    """The monitors of a config.json cluster id (CephCSIError for an unknown one), asked only
    by the krbd QoS step."""
