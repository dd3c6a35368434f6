"""Harness capability, not a driver feature (the driver has no encryption yet): the VM node's
kernel and tools can run dm-crypt on a krbd device — LUKS2 format and open with a key file,
data written through the dm device read back after close and reopen, and only ciphertext on the
RBD image. Groundwork for the encryption issue's tests."""
from __future__ import annotations

import pytest

from tests.vm.conftest import VmEnv, VmVolume, block_cap
from tests.vm.guestio import stage_record

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]

KEY = "/root/luks.key"
NAME = "cephcsi-crypt-test"
# pbkdf2 with few iterations: argon2's default memory cost is slow under TCG, and the key here
# protects nothing.
FORMAT = "cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file"


def test_dm_crypt_on_a_krbd_device_round_trips(vm_env: VmEnv, make_volume) -> None:  # type: ignore[no-untyped-def]
    volume: VmVolume = make_volume(64)
    staging = vm_env.staging()
    volume.stage(staging, block_cap())  # the driver maps; the test does the dm-crypt part by hand
    device = str(stage_record(vm_env.vm, staging)["device"])
    vm = vm_env.vm
    try:
        vm.check(f"modprobe dm_crypt && umask 077 && head -c 64 /dev/urandom >{KEY} && {FORMAT} {KEY} {device} && "
                 f"cryptsetup open --key-file {KEY} {device} {NAME}", timeout=180)
        assert vm.check(f"cryptsetup status {NAME}", timeout=30).count(device) == 1
        # A recognisable plaintext: 4 MiB of one repeated line, written through the dm device.
        digest = vm.check(
            "yes cephcsi-plaintext-marker | head -c 4M >/tmp/plain && "
            f"dd if=/tmp/plain of=/dev/mapper/{NAME} bs=1M oflag=direct conv=fsync status=none && "
            "sha256sum </tmp/plain && rm /tmp/plain", timeout=120).split()[0]
        vm.check(f"cryptsetup close {NAME} && cryptsetup open --key-file {KEY} {device} {NAME}", timeout=120)
        back = vm.check(f"dd if=/dev/mapper/{NAME} bs=1M count=4 iflag=direct status=none | sha256sum",
                        timeout=120).split()[0]
        assert back == digest
        # The image holds ciphertext only, and a LUKS2 header the kernel's blkid sees.
        raw = vm.run(f"dd if={device} bs=1M count=24 iflag=direct status=none | grep -c cephcsi-plaintext-marker",
                     timeout=120)
        assert raw.stdout.strip() == "0", raw
        assert vm.check(f"blkid -p -o value -s TYPE {device}", timeout=30).strip() == "crypto_LUKS"
    finally:
        vm.run(f"cryptsetup close {NAME} 2>/dev/null; rm -f {KEY}", timeout=120)
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
