"""The node's trim (cephcsi.node.reclaim) on a volume staged by a real `cephcsi --mode=node` on
real Ceph with the host's fuse mapper: 512 MiB written and deleted, then fstrim on the staging
mount. Whether the discards reach RADOS depends on the path loop → rbd-fuse: this test measures
`rbd du` and says which it is (the krbd path is proven in tests/vm/test_reclaim_space.py)."""
from __future__ import annotations

import json
import os

import pytest

from cephcsi.node import exec as node_exec, reclaim, stage_record
from tests.integration.node.conftest import NodeEnv, Volume, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]
MiB = 1 << 20


def du(env: NodeEnv, volume: Volume) -> int:
    doc = json.loads(env.cluster.admin("rbd", "du", "--format", "json", f"{env.cluster.pool}/{volume.image}"))
    return int(next(entry["used_size"] for entry in doc["images"] if entry["name"] == volume.image))


def test_trim_after_deleting_512_mib(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(1024)
    cap = mount_cap("ext4")
    staging = env.staging()
    volume.stage(staging, cap)
    fs = os.path.join(staging, "fs")
    chunk = os.urandom(4 * MiB)
    with open(os.path.join(fs, "data"), "wb") as handle:
        for _ in range(128):
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
    written = du(env, volume)
    assert written >= 512 * MiB, written
    os.unlink(os.path.join(fs, "data"))
    os.sync()

    record = stage_record.load(staging)
    assert record is not None
    done = reclaim.trim(record, node_exec.run, timeout=120)
    after = du(env, volume)
    volume.unstage(staging)

    assert done.outcome == reclaim.TRIMMED and done.trimmed_bytes >= 512 * MiB, done
    if after > written - 448 * MiB:
        # Measured on Linux 6.1 + rbd-fuse (Ceph 16-19): the loop driver turns discards into
        # fallocate(PUNCH_HOLE) on the rbd-fuse file, which rbd-fuse does not implement, so
        # nothing reaches librbd. docs/reclaim-space.md says so; this flips to a pass the day it does.
        pytest.xfail(f"discards do not reach RADOS through loop + rbd-fuse: rbd du {written // MiB} MiB "
                     f"before the trim, {after // MiB} MiB after")
