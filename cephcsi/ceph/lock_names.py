"""The name of a volume's rotation lock, one rule for every holder: ceph-csi's `<volume id>-mutexlock`
where an OSD can store it, else a digest of the id. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import hashlib

MAX_LOCK_NAME = 95
"""The longest name whose xattr `lock.<name>` an OSD accepts with its default
osd_max_attr_name_len of 100."""
SUFFIX = "-mutexlock"


def rotation_lock_name(volume_id: str) -> str:
    name = f"{volume_id}{SUFFIX}"
    if len(name) <= MAX_LOCK_NAME:
        return name
    return f"{hashlib.sha256(volume_id.encode()).hexdigest()}{SUFFIX}"
