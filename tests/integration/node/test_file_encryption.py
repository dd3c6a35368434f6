"""`encryptionType: file` (fscrypt) through a real `cephcsi --mode=node` on the real Ceph cluster
(fuse mapper: rbd-fuse + loop device, ext4 on this host's kernel): the stage sets up ceph-csi's
layout, publish binds the encrypted directory, unstage takes the key away, and a copy of the image
(`rbd export`) mounted without the key shows only encrypted names — which google/fscrypt's own tool
opens with the key ceph-csi derives. ~15 s.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import grpc
import pytest

from cephcsi.node.fscrypt import volume as fscrypt_volume
from cephcsi.node.mounts import top_mount
from tests.integration.node.conftest import NodeEnv, Volume, block_cap, expect_code, mount_cap
from tests.integration.node.test_fscrypt_layout import google_fscrypt

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

PASSPHRASE = "ZmlsZSBlbmNyeXB0aW9uIGluIGNlcGhjc2kgdGVzdHM="

if not os.path.exists("/sys/fs/ext4/features/encryption"):
    pytest.skip("this kernel's ext4 has no encryption support", allow_module_level=True)


def encrypt(volume: Volume) -> None:
    """The default KMS: the passphrase is the stage secret's encryptionPassphrase (stage())."""
    volume.context.update({"encrypted": "true", "encryptionType": "file"})


def stage(volume: Volume, staging: str) -> None:
    request = volume.stage_request(staging, mount_cap("ext4"))
    request.secrets["encryptionPassphrase"] = PASSPHRASE
    volume.env.node.NodeStageVolume(request, timeout=120)


def test_file_encrypted_volume_round_trip_is_ciphertext_on_the_image(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    encrypt(volume)
    staging, target = env.staging(), env.target()
    stage(volume, staging)
    stage(volume, staging)  # idempotent
    mount_path = os.path.join(staging, "fs")
    assert fscrypt_volume.is_unlocked(mount_path)
    volume.publish(staging, target, mount_cap("ext4"))
    published = top_mount(target)
    assert published is not None and published.root.endswith("/ceph-csi-encrypted")
    with open(os.path.join(target, "diary.txt"), "w") as f:
        f.write("written through the publish")
    os.mkdir(os.path.join(target, "photos"))
    volume.unpublish(target)
    volume.unstage(staging)

    # The image itself, without the key: encrypted names, unreadable contents, ceph-csi's layout.
    work = tempfile.mkdtemp(prefix="cephcsi-fscrypt-image-")
    copy, mnt = os.path.join(work, "fs.img"), os.path.join(work, "mnt")
    try:
        env.cluster.admin("rbd", "export", "--no-progress", f"{env.cluster.pool}/{volume.image}", copy)
        os.mkdir(mnt)
        subprocess.run(["mount", "-o", "loop", copy, mnt], check=True)
        try:
            names = sorted(os.listdir(os.path.join(mnt, "ceph-csi-encrypted")))
            assert len(names) == 2 and "diary.txt" not in names and "photos" not in names
            assert sorted(os.listdir(os.path.join(mnt, ".fscrypt"))) == ["policies", "protectors"]
            if shutil.which("fscrypt"):
                key = os.path.join(work, "key")
                with open(key, "wb") as f:
                    f.write(PASSPHRASE.encode()[:32])  # ceph-csi's raw key for a KMS-kept passphrase
                opened = google_fscrypt(Path(work), "unlock", os.path.join(mnt, "ceph-csi-encrypted"), f"--key={key}")
                assert opened.returncode == 0, opened.stderr
                with open(os.path.join(mnt, "ceph-csi-encrypted", "diary.txt")) as f:
                    assert f.read() == "written through the publish"
                fscrypt_volume.lock(mnt)
        finally:
            subprocess.run(["umount", mnt], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    # Staged again, the data is back in the clear.
    staging, target = env.staging(), env.target()
    stage(volume, staging)
    volume.publish(staging, target, mount_cap("ext4"))
    with open(os.path.join(target, "diary.txt")) as f:
        assert f.read() == "written through the publish"
    volume.unpublish(target)
    volume.unstage(staging)


def test_wrong_passphrase_and_block_claims_are_refused(env: NodeEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: Volume = make_volume(64)
    encrypt(volume)
    staging = env.staging()
    stage(volume, staging)
    volume.unstage(staging)
    request = volume.stage_request(env.staging(), mount_cap("ext4"))
    request.secrets["encryptionPassphrase"] = "not the passphrase"
    message = expect_code(grpc.StatusCode.PERMISSION_DENIED, env.node.NodeStageVolume, request, timeout=120)
    assert "not the passphrase" not in message and PASSPHRASE not in env.driver.log()
    request = volume.stage_request(env.staging(), block_cap())
    request.secrets["encryptionPassphrase"] = PASSPHRASE
    message = expect_code(grpc.StatusCode.INVALID_ARGUMENT, env.node.NodeStageVolume, request, timeout=60)
    assert "Block volume" in message
