"""Reclaiming space on a real kernel (issue 35's proof): a krbd-staged ext4 volume gets 512 MiB
written, the file deleted, the node's trim (cephcsi.node.reclaim.trim, run in the guest on the
plugin's own stage record, as the node pass does) hands part of it back while the volume is
staged, and once it is unstaged the controller's sparsify the rest: `rbd du` on the host drops
by the deleted data. krbd passes discards to RADOS; the host's rbd-fuse + loop path does
not (tests/integration/node/test_reclaim_trim.py)."""
from __future__ import annotations

import json
import shlex

import pytest

from cephcsi.ceph import sparsify
from tests.integration.controller.pool_state import admin_ioctx
from tests.vm.conftest import MiB, VmEnv, VmVolume, mount_cap
from tests.vm.machine import GUEST_VENV_PYTHON

# 900 s: the first test of a session also waits for the VM to boot under TCG.
# In the long tier (the host tier proves reclaim through rbd-fuse), out of CI's 90 minutes.
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.long, pytest.mark.timeout(900)]

TRIM = ("import json, sys\n"
        "from cephcsi.node import exec as node_exec, reclaim, stage_record\n"
        "record = stage_record.load(sys.argv[1])\n"
        "done = reclaim.trim(record, node_exec.run, 600.0)\n"
        "print(json.dumps({'outcome': done.outcome, 'bytes': done.trimmed_bytes, 'reason': done.reason}))\n")


def du(env: VmEnv, volume: VmVolume) -> int:
    doc = json.loads(env.cluster.admin("rbd", "du", "--format", "json", f"{env.cluster.pool}/{volume.image}"))
    return int(next(entry["used_size"] for entry in doc["images"] if entry["name"] == volume.image))


def test_deleted_files_return_to_the_pool_after_the_node_trim(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(768, mounter="krbd")
    cap = mount_cap("ext4")
    staging = vm_env.staging()
    volume.stage(staging, cap)
    fs = f"{staging}/fs"
    vm = vm_env.vm
    assert "discard" not in vm.check(f"findmnt -no OPTIONS {shlex.quote(fs)}", timeout=30)  # off by default
    vm.check(f"yes cephcsi-reclaim-space | head -c 512M >{fs}/data && sync {fs}/data", timeout=300)
    written = du(vm_env, volume)
    assert written >= 512 * MiB, written

    vm.check(f"rm {fs}/data && sync -f {fs}", timeout=60)
    assert du(vm_env, volume) >= 512 * MiB  # deleting alone gives nothing back
    repo = shlex.quote(vm.repo)
    out = vm.check(f"cd {repo} && env PYTHONPATH={repo} PYTHONDONTWRITEBYTECODE=1 {GUEST_VENV_PYTHON} "
                   f"-c {shlex.quote(TRIM)} {shlex.quote(staging)}", timeout=600)
    done = json.loads(out.strip().splitlines()[-1])
    assert done["outcome"] == "trimmed" and done["bytes"] >= 512 * MiB, done
    trimmed = du(vm_env, volume)
    # Measured on Linux 6.1: 536 MiB -> 296 MiB. The objects left are allocated but all zeros
    # (the sparsify below removes them): krbd zeroed those ranges instead of deleting the objects
    # (docs/reclaim-space.md; the same with an ext4 aligned to the 4 MiB objects).
    assert trimmed <= written - 128 * MiB, (written, trimmed)
    print(f"rbd du: {written // MiB} MiB written, {trimmed // MiB} MiB after the node trim")

    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
    # Unused now: the controller's sparsify removes the objects the trim left zeroed.
    with admin_ioctx(vm_env.cluster) as io:
        done = sparsify.sparsify(io, volume.image)
    assert not done.in_use
    after = du(vm_env, volume)
    print(f"rbd du: {after // MiB} MiB after the controller's sparsify")
    assert after <= written - 480 * MiB, (written, trimmed, after)
