"""The stage record: what NodeUnstageVolume needs to undo a NodeStageVolume, kept on disk.

`<staging>/cephcsi-stage.json` beside `<staging>/fs` (filesystem mount) or `<staging>/block`
(device bind); rewritten atomically before each step that creates something and after each that
learns something, removed last. docs/design/node.md, "Staging and its record".
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields

from cephcsi.errors import Internal

RECORD_NAME = "cephcsi-stage.json"
TMP_PREFIX = ".cephcsi-stage-"
FS_DIR = "fs"
BLOCK_FILE = "block"
VERSION = 1

ACCESS_MOUNT = "mount"
ACCESS_BLOCK = "block"


@dataclass(frozen=True)
class ImageSpec:
    pool: str
    image: str
    namespace: str = ""

    def __str__(self) -> str:
        return "/".join(part for part in (self.pool, self.namespace, self.image) if part)


@dataclass(frozen=True)
class LoopBacking:
    """A fuse mapping's loop device as the kernel described it right after the attach. Its
    sysfs backing_file names our work dir only while the rbd-fuse mount is in this mount
    namespace; after a plugin restart without a drain it reads `/<image>` (the mount died with
    the old container's namespace). These values still identify the loop then, and tell it
    from a loop that later got the same device name."""

    device: str
    diskseq: int = 0
    """/sys/block/<loop>/diskseq: changes on every attach and detach (Linux >= 5.15; 0 unknown).
    Readable even when the backing file is not (a dead FUSE mount fails every stat with ENOTCONN)."""
    file_name: str = ""
    """lo_file_name (LOOP_GET_STATUS64): the path losetup attached (first 63 bytes)."""
    backing_major: int = 0
    backing_minor: int = 0
    """The backing file's st_dev (the rbd-fuse mount's anonymous device, unique while it lives)."""
    backing_inode: int = 0


@dataclass
class StageRecord:
    volume_id: str
    staging_path: str
    cluster_id: str
    pool: str
    image: str
    namespace: str
    mapper: str
    """krbd | rbd-nbd | fuse: unstage always uses the mapper that mapped, never a new choice."""
    access_type: str
    """mount | block."""
    fs_type: str = ""
    read_only: bool = False
    mount_flags: list[str] = field(default_factory=list)
    unmap_options: list[str] = field(default_factory=list)
    work_dir: str = ""
    """Mapper-private directory (fuse: the rbd-fuse mount and its config), empty for krbd/nbd."""
    device: str = ""
    """Block device once mapped; empty while mapping (then re-derived from the system)."""
    mkfs_started: bool = False
    """Set before mkfs, after blkid found the device empty. A resumed stage never redoes mkfs
    from it (another node may have used the filesystem since): it only tells the logs and error
    messages that whatever the device holds may be what our mkfs left."""
    mkfs_uuid: str = ""
    """The UUID given to our mkfs, saved before it runs ('' in records of older versions)."""
    loop: LoopBacking | None = None
    """fuse mapper: the loop device attached for this stage, to detach it even when its backing
    file no longer reads as our work dir."""
    encryption: str = ""
    """"block" for a LUKS-encrypted volume, '' for a plain one."""
    crypt_name: str = ""
    """The dm-crypt mapping (luks-rbd-<volume id>) of an encrypted volume, recorded before it is
    opened, so unstage closes it even when a crash came between the open and the next save."""
    formatted: bool = False
    staged: bool = False
    """All steps done."""
    version: int = VERSION

    @property
    def image_spec(self) -> ImageSpec:
        return ImageSpec(self.pool, self.image, self.namespace)

    @property
    def data_device(self) -> str:
        """What holds the filesystem or is bound for Block: the open LUKS mapping of an encrypted
        volume, else the mapped device."""
        return f"/dev/mapper/{self.crypt_name}" if self.crypt_name else self.device

    @property
    def mount_path(self) -> str:
        """Where the volume appears under the staging path (a dir for mount, a file for block)."""
        return os.path.join(self.staging_path, FS_DIR if self.access_type == ACCESS_MOUNT else BLOCK_FILE)


def record_path(staging_path: str) -> str:
    return os.path.join(staging_path, RECORD_NAME)


def load(staging_path: str) -> StageRecord | None:
    """The record at a staging path, None when there is none. A record we cannot parse is an
    error, not "nothing staged": guessing could unmap the wrong device or mount over data."""
    path = record_path(staging_path)
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    except (OSError, ValueError) as error:
        raise Internal(f"stage record {path} is unreadable ({error}); inspect the staging path by hand") from None
    known = {f.name for f in fields(StageRecord)}
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise Internal(f"stage record {path} has an unknown format; inspect the staging path by hand")
    try:
        values = {k: v for k, v in doc.items() if k in known}
        if values.get("loop") is not None:
            values["loop"] = LoopBacking(**values["loop"])
        return StageRecord(**values)
    except TypeError as error:
        raise Internal(f"stage record {path} is incomplete ({error}); inspect the staging path by hand") from None


def save(record: StageRecord) -> None:
    """Atomically replace the record (a reader sees the old or the new one, never a mix)."""
    directory = record.staging_path
    data = json.dumps(asdict(record), indent=1, sort_keys=True).encode()
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".tmp", dir=directory)
    try:
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, record_path(directory))
        tmp = ""
        _fsync_dir(directory)
    except OSError as error:
        raise Internal(f"cannot write stage record in {directory}: {error.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def remove(staging_path: str) -> None:
    try:
        os.unlink(record_path(staging_path))
    except FileNotFoundError:
        return
    _fsync_dir(staging_path)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
