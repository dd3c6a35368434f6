"""The files and directories of a staging path: the staging directory itself, the mount point
made before a mount (the `fs` directory, or the `block` file a device is bound onto), and what
unstage removes once nothing is mounted there — never recursively, never files someone wrote.
A path that is in the way is FAILED_PRECONDITION or INVALID_ARGUMENT; an OS error, INTERNAL."""
from __future__ import annotations

import os

from cephcsi.errors import FailedPrecondition, Internal, InvalidArgument
from cephcsi.node import mounts, stage_record
from cephcsi.node.stage_record import BLOCK_FILE, FS_DIR


def ensure_staging_dir(path: str) -> None:
    # The CO creates it; being lenient costs nothing and helps manual testing.
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise InvalidArgument(f"staging_target_path {path} exists and is not a directory") from None
    except OSError as error:
        raise Internal(f"cannot create staging_target_path {path}: {error.strerror}") from None


def make_mount_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o750)
    except FileExistsError:
        if not os.path.isdir(path):
            raise FailedPrecondition(f"{path} exists and is not a directory; remove it and retry") from None
    except OSError as error:
        raise Internal(f"cannot create mount point {path}: {error.strerror}") from None


def make_bind_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o640)
        os.close(fd)
    except IsADirectoryError:
        raise FailedPrecondition(f"{path} exists and is a directory; a block volume needs a file there") from None
    except OSError as error:
        raise Internal(f"cannot create bind target {path}: {error.strerror}") from None


def remove_leftovers(staging_path: str) -> None:
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
