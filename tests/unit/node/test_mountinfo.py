from __future__ import annotations

import pytest

from cephcsi.node.mounts import mounts_at, mounts_sharing, parse_mountinfo, parse_mountinfo_line, top_mount

pytestmark = pytest.mark.unit

SAMPLE = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
24 27 0:6 / /dev rw,relatime shared:2 - devtmpfs devtmpfs rw,size=1k,mode=755
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
60 27 7:3 / /k/plugins/st/fs rw,relatime - ext4 /dev/loop3 rw
61 27 7:3 / /k/pods/p1/mount rw,relatime - ext4 /dev/loop3 rw
62 27 7:3 /sub /k/pods/p2/mount ro,relatime - ext4 /dev/loop3 rw
63 27 7:4 / /k/other rw,relatime - ext4 /dev/loop4 rw
64 27 0:6 /loop5 /k/plugins/blk/block rw,relatime shared:2 - devtmpfs devtmpfs rw,size=1k
65 27 0:6 /loop5 /k/pods/p3/dev rw,relatime - devtmpfs devtmpfs rw,size=1k
66 27 0:6 /loop6 /k/pods/p4/dev rw,relatime - devtmpfs devtmpfs rw,size=1k
67 27 0:40 / /with\\040space\\011tab\\134back rw - fuse.rbd-fuse rbd-fuse rw,user_id=0
68 67 0:41 / /with\\040space\\011tab\\134back rw master:7 shared:9 - tmpfs tmpfs rw
"""


def test_parse_fields() -> None:
    entry = parse_mountinfo_line("60 27 7:3 / /k/plugins/st/fs rw,relatime - ext4 /dev/loop3 rw,errors=remount-ro")
    assert (entry.mount_id, entry.parent_id, entry.major, entry.minor) == (60, 27, 7, 3)
    assert entry.root == "/"
    assert entry.mount_point == "/k/plugins/st/fs"
    assert entry.options == ("rw", "relatime")
    assert entry.fs_type == "ext4"
    assert entry.source == "/dev/loop3"
    assert entry.super_options == ("rw", "errors=remount-ro")
    assert not entry.read_only


def test_optional_fields_and_escapes() -> None:
    table = parse_mountinfo(SAMPLE)
    assert len(table) == 12
    dev = table[1]
    assert dev.fs_type == "devtmpfs" and dev.mount_point == "/dev"
    fuse = table[-2]
    assert fuse.mount_point == "/with space\ttab\\back"
    assert fuse.fs_type == "fuse.rbd-fuse"
    stacked = mounts_at("/with space\ttab\\back", table)
    assert [e.mount_id for e in stacked] == [67, 68]
    top = top_mount("/with space\ttab\\back", table)
    assert top is not None and top.mount_id == 68


def test_malformed_line() -> None:
    with pytest.raises(ValueError):
        parse_mountinfo_line("1 2 3:4 / /x rw")


def test_sharing_filesystem_binds() -> None:
    table = parse_mountinfo(SAMPLE)
    anchor = top_mount("/k/plugins/st/fs", table)
    assert anchor is not None
    assert [e.mount_point for e in mounts_sharing(anchor, table)] == ["/k/pods/p1/mount", "/k/pods/p2/mount"]


def test_sharing_device_binds() -> None:
    table = parse_mountinfo(SAMPLE)
    anchor = top_mount("/k/plugins/blk/block", table)
    assert anchor is not None
    # Same devtmpfs numbers as /dev itself: only binds of the same node (root /loop5) count.
    assert [e.mount_point for e in mounts_sharing(anchor, table)] == ["/k/pods/p3/dev"]


def test_read_only_flag() -> None:
    table = parse_mountinfo(SAMPLE)
    p2 = top_mount("/k/pods/p2/mount", table)
    assert p2 is not None and p2.read_only
