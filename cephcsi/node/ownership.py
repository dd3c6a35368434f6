"""Which volume ids a staging or publish path belongs to, from the system itself.

NodeGetVolumeStats carries no volume context, so a static volume's id (a bare image name, see
cephcsi.node.volume_source) cannot be told from a made-up id by its form; the path must show it:
a stage record of ours naming it, or ceph-csi's layout (`<staging>/<volume id>` next to its
`image-meta.json`), at the path or at the staging mount the path is a bind of.
"""
from __future__ import annotations

import os

from cephcsi.errors import CephCSIError
from cephcsi.node import legacy_stage, mounts, stage_record
from cephcsi.node.stage_record import BLOCK_FILE, FS_DIR


def volume_ids_at(path: str) -> set[str]:
    ids = _recorded(path)
    table = mounts.read_mounts()
    entry = mounts.top_mount(path, table)
    if entry is None:
        return ids
    for mount in (entry, *mounts.mounts_sharing(entry, table)):
        parent, name = os.path.split(mount.mount_point)
        if name in (FS_DIR, BLOCK_FILE):
            ids |= _recorded(parent)
        elif os.path.exists(os.path.join(parent, legacy_stage.STASH_NAME)):
            ids.add(name)
    return ids


def _recorded(directory: str) -> set[str]:
    try:
        record = stage_record.load(directory)
    except CephCSIError:
        return set()  # unreadable: proves nothing either way
    return {record.volume_id} if record is not None else set()
