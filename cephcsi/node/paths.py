"""Checks on the staging and target paths a CO hands us, before anything is mounted there.

Mounting and removing happen as root, so a path is accepted only when it is absolute, has no
`..` component, and — when --kubelet-dir is set — resolves (symlinks included) to somewhere
under the kubelet directory: a request cannot make the plugin mount over, or delete, /etc.
"""
from __future__ import annotations

import os

from cephcsi.errors import InvalidArgument


def check_path(path: str, field: str, kubelet_dir: str) -> str:
    """The normalized path, or INVALID_ARGUMENT naming `field` and what is wrong."""
    if not path:
        raise InvalidArgument(f"{field} is required")
    if "\0" in path:
        raise InvalidArgument(f"{field} contains a NUL byte")
    if not os.path.isabs(path):
        raise InvalidArgument(f"{field} {path!r} must be an absolute path")
    if ".." in path.split("/"):
        raise InvalidArgument(f"{field} {path!r} must not contain '..' components")
    normalized = os.path.normpath(path)
    if normalized == "/":
        raise InvalidArgument(f"{field} must not be the root directory")
    if kubelet_dir:
        root = os.path.realpath(kubelet_dir)
        real = os.path.realpath(normalized)
        if not real.startswith(root.rstrip("/") + "/"):
            raise InvalidArgument(
                f"{field} {path!r} is not inside the kubelet directory {kubelet_dir} (set by --kubelet-dir)"
            )
    return normalized


def nested(a: str, b: str) -> bool:
    """True when one path equals or lies inside the other."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def check_volume_id(volume_id: str, field: str = "volume_id") -> str:
    if not volume_id:
        raise InvalidArgument(f"{field} is required")
    if len(volume_id) > 128 or any(c in volume_id for c in "\0\n/"):
        raise InvalidArgument(f"{field} {volume_id[:140]!r} is not a valid volume id (at most 128 bytes, no '/')")
    return volume_id
