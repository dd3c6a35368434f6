"""A volume staged and published by ceph-csi's node plugin, served by cephcsi after the switch
(docs/migrate-from-ceph-csi.md): the kubelet keeps ceph-csi's paths, so cephcsi must publish
from, re-stage and unpublish/unstage them. ceph-csi's layout (internal/rbd/nodeserver.go):
`<staging>/image-meta.json` (its stash) and the filesystem mounted at `<staging>/<volume id>`,
publishes bind-mounted from there. The volume has ceph-csi's id encoding and image naming
(`0001-<len>-<clusterID>-<pool id>-<uuid>`, `csi-vol-<uuid>`).

This node has no rbd/nbd kernel modules, so ceph-csi's krbd mapping is stood in for by the
device of a cephcsi fuse stage elsewhere; what is tested is the layout handling (mounts, stash,
refusals), and that the krbd unmap finds nothing mapped and succeeds. An rbd-nbd stage
(`accessType` true) is checked by the argv of its unmap, through an `rbd` on PATH that answers
for nbd as `rbd-nbd list-mapped` does and passes everything else to the real tool, and by what
its unstage leaves of the daemon's log file (the stash's `logDir`/`logFileStrategy`)."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.node.mounts import top_mount
from cephcsi.volumes.volume_id import VolumeId
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import NodeEnv, Volume, assert_no_leftovers, block_cap, expect_code, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


def write_stash(staging: str, pool: str, image: str, nbd_device: str = "", log_dir: str = "/var/log/ceph",
                log_strategy: str = "remove") -> None:
    """ceph-csi's image-meta.json: krbd, or rbd-nbd (`accessType` true, its device and log
    settings) when nbd_device is given."""
    with open(os.path.join(staging, "image-meta.json"), "w") as handle:
        json.dump({"Version": 3, "pool": pool, "radosNamespace": "", "image": image, "unmapOptions": "",
                   "accessType": bool(nbd_device), "encrypted": False, "device": nbd_device,
                   "logDir": log_dir if nbd_device else "", "logFileStrategy": log_strategy if nbd_device else ""},
                  handle)


def ceph_csi_stage(volume: Volume, device: str, staging: str) -> str:
    """What ceph-csi's NodeStageVolume leaves for a krbd-mapped ext4 volume."""
    write_stash(staging, volume.context["pool"], volume.image)
    mount_point = os.path.join(staging, volume.volume_id)
    os.mkdir(mount_point, 0o750)
    subprocess.run(["mount", "-t", "ext4", "-o", "_netdev", device, mount_point], check=True)
    return mount_point


def ceph_csi_block_stage(volume: Volume, device: str, staging: str) -> str:
    """What ceph-csi's NodeStageVolume leaves for a krbd-mapped Block volume: the device
    bind-mounted onto the file `<staging>/<volume id>`."""
    write_stash(staging, volume.context["pool"], volume.image)
    target = os.path.join(staging, volume.volume_id)
    os.close(os.open(target, os.O_CREAT | os.O_RDWR, 0o600))
    subprocess.run(["mount", "--bind", device, target], check=True)
    return target


def cephcsi_device(env: NodeEnv, volume: Volume, cap: object) -> tuple[str, str]:
    """(helper staging path, device) of a cephcsi fuse stage at another path, standing in for
    the krbd device; its own mount is undone so that only ceph-csi's uses the device (a second
    mount of it would count as a publish)."""
    helper = env.staging()
    volume.stage(helper, cap)  # type: ignore[arg-type]
    with open(os.path.join(helper, "cephcsi-stage.json")) as handle:
        record = json.load(handle)
    subprocess.run(["umount", os.path.join(helper, "block" if record["access_type"] == "block" else "fs")], check=True)
    return helper, str(record["device"])


def test_volume_staged_by_ceph_csi_is_published_and_unstaged(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    object_uuid = str(uuid.uuid4())
    volume.volume_id = VolumeId(env.cluster.cluster_id, 1, object_uuid).encode()
    cap = mount_cap("ext4")
    helper, device = cephcsi_device(env, volume, cap)

    staging, old_target, new_target = env.staging(), env.target(), env.target()
    legacy_mount = ceph_csi_stage(volume, device, staging)
    os.mkdir(old_target)
    subprocess.run(["mount", "--bind", legacy_mount, old_target], check=True)  # ceph-csi's publish
    with open(os.path.join(old_target, "kept.txt"), "w") as handle:
        handle.write("written under ceph-csi")

    # After the switch: a kubelet restart re-stages (no second mount), a new pod publishes from it.
    volume.stage(staging, cap)
    assert not os.path.exists(os.path.join(staging, "fs")) and not os.path.exists(os.path.join(staging, "cephcsi-stage.json"))
    volume.publish(staging, new_target, cap)
    with open(os.path.join(new_target, "kept.txt")) as handle:
        assert handle.read() == "written under ceph-csi"
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.unstage, staging)
    assert "still published" in message
    assert top_mount(legacy_mount) is not None

    volume.unpublish(old_target)
    volume.unpublish(new_target)
    volume.unstage(staging)
    assert os.listdir(staging) == []  # ceph-csi's mount point and stash are gone
    volume.unstage(staging)  # idempotent
    volume.unstage(helper)
    assert_no_leftovers(env, volume)


def test_encrypted_ceph_csi_stage_is_unstaged(env: NodeEnv) -> None:
    """A LUKS stage of ceph-csi's whose mapping and device are already gone (this host has no
    device-mapper; closing a real mapping is tests/vm/test_encrypted_stage.py's): the unstage
    finds nothing open or mapped and removes the stash."""
    volume_id = VolumeId(env.cluster.cluster_id, 1, str(uuid.uuid4())).encode()
    staging = env.staging()
    with open(os.path.join(staging, "image-meta.json"), "w") as handle:
        json.dump({"Version": 3, "pool": env.cluster.pool, "image": "csi-vol-x", "encrypted": True}, handle)
    env.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging))
    assert os.listdir(staging) == []


def test_block_volume_staged_by_ceph_csi_is_published_and_unstaged(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    volume.volume_id = VolumeId(env.cluster.cluster_id, 1, str(uuid.uuid4())).encode()
    cap = block_cap()
    helper, device = cephcsi_device(env, volume, cap)

    staging, old_target, new_target = env.staging(), env.target(), env.target()
    legacy_file = ceph_csi_block_stage(volume, device, staging)
    os.close(os.open(old_target, os.O_CREAT | os.O_RDWR, 0o600))
    subprocess.run(["mount", "--bind", legacy_file, old_target], check=True)  # ceph-csi's publish
    data = b"written under ceph-csi"
    fd = os.open(old_target, os.O_WRONLY)
    try:
        os.pwrite(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)

    # A kubelet restart's re-stage takes ceph-csi's stage as it is; a new pod publishes from it.
    volume.stage(staging, cap)
    assert sorted(os.listdir(staging)) == sorted(["image-meta.json", volume.volume_id])
    volume.publish(staging, new_target, cap)
    fd = os.open(new_target, os.O_RDONLY)
    try:
        assert os.pread(fd, len(data), 0) == data
    finally:
        os.close(fd)
    message = expect_code(grpc.StatusCode.FAILED_PRECONDITION, volume.unstage, staging)
    assert "still published" in message

    volume.unpublish(old_target)
    volume.unpublish(new_target)
    assert not os.path.lexists(new_target)
    volume.unstage(staging)
    assert os.listdir(staging) == []  # ceph-csi's device file and stash are gone
    volume.unstage(staging)
    volume.unstage(helper)
    assert_no_leftovers(env, volume)


FAKE_RBD = """#!/bin/sh
# Answers for rbd-nbd as `rbd-nbd list-mapped --format json` does (the image under "image"),
# records every call, and hands anything else to the real rbd.
echo "$*" >> {log}
case "$*" in
  "device list --device-type nbd --format json")
    if [ -e {mapped} ]; then
      printf '[{{"id":4242,"pool":"{pool}","namespace":"","image":"{image}","snap":"","device":"{device}","cookie":""}}]'
    else
      printf '[]'
    fi
    exit 0 ;;
  "device unmap --device-type nbd "*) rm -f {mapped}; exit 0 ;;
esac
exec {real} "$@"
"""


@pytest.fixture
def nbd_node(env: NodeEnv) -> Iterator[tuple[DriverProcess, str, str]]:
    """A second node plugin whose `rbd` is FAKE_RBD: (driver, its bin folder, the call log)."""
    root = tempfile.mkdtemp(prefix="nbd-", dir=env.root)
    bin_dir = os.path.join(root, "bin")
    os.makedirs(bin_dir)
    driver = DriverProcess(
        env.driver.config_file, mode="node",
        args=["--nodeid=test-node", f"--kubelet-dir={env.kubelet}", f"--state-dir={os.path.join(root, 'state')}"],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, workdir=os.path.join(root, "drv"),
    )
    os.makedirs(driver.workdir)
    driver.start()
    try:
        yield driver, bin_dir, os.path.join(root, "rbd-calls.log")
    finally:
        driver.stop()


@pytest.mark.parametrize("strategy", ["remove", "compress", "preserve"])
def test_rbd_nbd_stage_of_ceph_csi_is_unmapped_with_rbd_nbd(env: NodeEnv, nbd_node: tuple[DriverProcess, str, str],
                                                            strategy: str) -> None:
    driver, bin_dir, calls = nbd_node
    volume_id = VolumeId(env.cluster.cluster_id, 1, str(uuid.uuid4())).encode()
    image, device = f"csi-vol-{volume_id[-36:]}", "/dev/nbd7"
    mapped = os.path.join(bin_dir, "mapped")
    fake = os.path.join(bin_dir, "rbd")
    with open(fake, "w") as handle:
        handle.write(FAKE_RBD.format(log=calls, mapped=mapped, pool=env.cluster.pool, image=image, device=device,
                                     real=shutil.which("rbd")))
    os.chmod(fake, 0o755)
    open(mapped, "w").close()

    # ceph-csi's rbd-nbd stage; its filesystem stood in for by a tmpfs (no nbd module here). Its
    # rbd-nbd daemon logged to <logDir>/rbd-nbd-<volume id>.log, beside another volume's log.
    log_dir = tempfile.mkdtemp(prefix="cephlog-", dir=env.root)
    log_name, other_name = f"rbd-nbd-{volume_id}.log", "rbd-nbd-another-volume.log"
    log_text = b"rbd-nbd: mapped\n" * 1000
    for name in (log_name, other_name):
        with open(os.path.join(log_dir, name), "wb") as handle:
            handle.write(log_text)
    staging = env.staging()
    write_stash(staging, env.cluster.pool, image, nbd_device=device, log_dir=log_dir, log_strategy=strategy)
    mount_point = os.path.join(staging, volume_id)
    os.mkdir(mount_point, 0o750)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mount_point], check=True)

    driver.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging),
                                  timeout=60)
    assert top_mount(mount_point) is None
    assert os.listdir(staging) == []
    with open(calls) as handle:
        argv = [line.strip() for line in handle]
    assert f"device unmap --device-type nbd {device}" in argv, argv
    assert not os.path.exists(mapped)

    # What ceph-csi's unstage does to the log (its names: `.log` becomes `.gz`, not `.log.gz`).
    left = {"remove": [other_name], "compress": [f"rbd-nbd-{volume_id}.gz", other_name],
            "preserve": [log_name, other_name]}[strategy]
    assert sorted(os.listdir(log_dir)) == sorted(left)
    for name in left:
        with open(os.path.join(log_dir, name), "rb") as handle:
            data = handle.read()
        assert (gzip.decompress(data) if name.endswith(".gz") else data) == log_text
