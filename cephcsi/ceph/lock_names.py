"""The name of a volume's rotation lock, one rule for every holder (the node's first LUKS format and
`cephcsi rotate-key` through the `rados` tool, the controller's snapshot and clone cut through
librados): ceph-csi's `<volume id>-mutexlock` where Ceph can store it.

cls_lock keeps a lock in the object's xattr `lock.<name>`, and OSDs refuse an xattr name longer
than `osd_max_attr_name_len` (100) with ENAMETOOLONG. A volume id whose cluster id is a 36-character
fsid is 100 characters, so ceph-csi's name cannot be taken for it: ceph-csi's own rotation of such a
volume fails on it, so no ceph-csi holder can exist to be excluded. Those volumes get a name made
from a digest of the id instead, short enough for every OSD, the same for all of cephcsi's holders.
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
