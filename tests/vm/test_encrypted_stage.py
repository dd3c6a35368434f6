"""Block encryption (LUKS2, ceph-csi's `encrypted: "true"`, `encryptionType: block`) staged by the
driver on a real kernel, with ceph-csi's default KMS (the passphrase is the stage secret's
`encryptionPassphrase`; the image metadata carries the state, as CreateVolume leaves it).

krbd + ext4: the first stage formats LUKS2 ("encryptionPrepared" → "encrypted"), the image holds
ciphertext only, the filesystem grows online through `cryptsetup resize`, unstage closes the
mapping, the image grows while unstaged and a restage opens the same header, grows the
filesystem and reads the data back; then ceph-csi's own
`cryptsetup luksOpen` line opens that header, and the stage ceph-csi leaves on a node is
unstaged by cephcsi (mapping closed, image unmapped).
rbd-nbd + Block: a header written by ceph-csi's own `luksFormat` line opens under cephcsi, data
survives unstage and restage, the mapping grows online, and a wrong passphrase is
PERMISSION_DENIED with nothing left mapped or open.
krbd + Block with the `metadata` KMS: the LUKS key is the per-volume passphrase unwrapped from the
image metadata (ceph-csi's {"dek","nonce"} JSON), not the StorageClass secret.
Neither passphrase ever appears in the plugin's log."""
from __future__ import annotations

import json
import shlex
from collections.abc import Callable

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.encryption.kms.secrets import wrap
from cephcsi.encryption.volume_keys import DEK_KEY as DEK, new_passphrase
from tests.integration.node.conftest import expect_code
from tests.vm.conftest import STAGING_ROOT, MiB, VmEnv, VmVolume, block_cap, mount_cap
from tests.vm.guestio import device_bytes, fs_bytes, read_payload, stage_record, write_payload

# 900 s: the first test also waits for the VM to boot under TCG (up to ~8 minutes on a loaded host).
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.timeout(900)]

STATE = "rbd.csi.ceph.com/encrypted"
PASSPHRASE = "cephcsi-vm-test-passphrase-0f3a9c"
MARKER = "cephcsi-plaintext-marker"
# ceph-csi's cryptsetup lines (internal/util/cryptsetup.go), run by hand as its node plugin runs them.
CEPH_CSI_FORMAT = "cryptsetup -q luksFormat --type luks2 --hash sha256 --pbkdf-memory 32768 {device} -d /dev/stdin"
CEPH_CSI_OPEN = "cryptsetup luksOpen {device} {name} --disable-keyring -d /dev/stdin"


def encrypted_volume(make_volume: Callable[..., VmVolume], vm_env: VmEnv, mounter: str, state: str) -> VmVolume:
    volume = make_volume(64, mounter=mounter, encrypted="true", encryptionType="block")
    vm_env.cluster.admin("rbd", "image-meta", "set", f"{vm_env.cluster.pool}/{volume.image}", STATE, state)
    return volume


def image_state(vm_env: VmEnv, volume: VmVolume) -> str:
    return vm_env.cluster.admin("rbd", "image-meta", "get", f"{vm_env.cluster.pool}/{volume.image}", STATE).strip()


def stage(volume: VmVolume, staging: str, cap: csi_pb2.VolumeCapability, passphrase: str = PASSPHRASE) -> None:
    volume.plugin.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
        volume_id=volume.volume_id, staging_target_path=staging, volume_capability=cap,
        secrets={**volume.cluster.secrets, "encryptionPassphrase": passphrase},
        volume_context=volume.context), timeout=240)


def mapping(volume: VmVolume) -> str:
    return f"luks-rbd-{volume.volume_id}"


def assert_closed(vm_env: VmEnv, volume: VmVolume) -> None:
    assert vm_env.vm.run(f"cryptsetup status {mapping(volume)}", timeout=60).rc == 4  # inactive
    assert vm_env.vm.run(f"test -e /dev/mapper/{mapping(volume)}", timeout=30).rc != 0


def map_by_hand(vm_env: VmEnv, volume: VmVolume) -> str:
    """`rbd device map` (krbd) in the VM, as ceph-csi's node plugin maps; the device."""
    cluster = vm_env.cluster
    key = vm_env.vm.host_path("csi.key")
    with open(key, "w", encoding="utf-8") as handle:
        handle.write(cluster.key)
    try:
        return vm_env.vm.check(
            f"rbd device map --id {cluster.user} -m {shlex.quote(cluster.mon_host)} "
            f"--keyfile {vm_env.vm.guest_path('csi.key')} {cluster.pool}/{volume.image}", timeout=120).strip()
    finally:
        vm_env.vm.check(f"rm -f {vm_env.vm.guest_path('csi.key')}", timeout=30)


def with_passphrase(command: str) -> str:
    return f"printf %s {shlex.quote(PASSPHRASE)} | {command}"


def test_krbd_ext4_formats_once_holds_ciphertext_grows_online_and_ceph_csi_opens_it(
        vm_env: VmEnv, make_volume: Callable[..., VmVolume]) -> None:
    vm = vm_env.vm
    volume = encrypted_volume(make_volume, vm_env, "krbd", "encryptionPrepared")
    cap = mount_cap("ext4")
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    record = stage_record(vm, staging)
    device = str(record["device"])
    assert record["crypt_name"] == mapping(volume) and record["mapper"] == "krbd"
    assert image_state(vm_env, volume) == "encrypted"
    status = vm.check(f"cryptsetup status {mapping(volume)}", timeout=60)
    assert "LUKS2" in status and f"device:  {device}" in status, status
    assert vm.check(f"blkid -p -o value -s TYPE {device}", timeout=30).strip() == "crypto_LUKS"
    header = vm.check(f"cryptsetup luksUUID {device}", timeout=30).strip()

    vm.check(f"yes {MARKER} | head -c 4M >{target}/plain && sync {target}/plain", timeout=120)
    digest = write_payload(vm, target, block=False)
    raw = vm.run(f"dd if={device} bs=1M iflag=direct status=none | grep -c {MARKER}", timeout=180)
    assert raw.stdout.strip() == "0", raw  # the image holds ciphertext only

    before = fs_bytes(vm, target)
    volume.grow(128)
    assert volume.expand(target, 128, staging) == 128 * MiB
    assert fs_bytes(vm, target) > before + 48 * MiB  # 64 MiB more on the image, less ext4's overhead
    assert device_bytes(vm, f"/dev/mapper/{mapping(volume)}") == (128 - 16) * MiB  # LUKS2's 16 MiB header
    assert read_payload(vm, target, block=False) == digest

    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)
    assert vm_env.mapped("krbd") == ""

    # Grown while unstaged, then restaged: the same header opened (never formatted again), the
    # filesystem grown at the stage, the data read back.
    volume.grow(160)
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    device = str(stage_record(vm, staging)["device"])
    assert vm.check(f"cryptsetup luksUUID {device}", timeout=30).strip() == header
    assert fs_bytes(vm, target) > before + (48 + 24) * MiB  # both growths: 96 MiB, less ext4's overhead
    assert read_payload(vm, target, block=False) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)

    # ceph-csi's node plugin stages the same volume (its open line, its layout: the filesystem at
    # <staging>/<volume id>, its stash); after the switch, cephcsi unstages what it left.
    legacy = f"{STAGING_ROOT}/legacy-{volume.image}/globalmount"
    device = map_by_hand(vm_env, volume)
    stash = {"Version": 3, "pool": vm_env.cluster.pool, "radosNamespace": "", "image": volume.image,
             "unmapOptions": "", "accessType": False, "encrypted": True, "device": device,
             "logDir": "", "logFileStrategy": ""}
    vm.check(with_passphrase(CEPH_CSI_OPEN.format(device=device, name=mapping(volume))) + " && "
             f"mkdir -p {legacy}/{volume.volume_id} && "
             f"mount -t ext4 /dev/mapper/{mapping(volume)} {legacy}/{volume.volume_id} && "
             f"echo {shlex.quote(json.dumps(stash))} >{legacy}/image-meta.json", timeout=180)
    assert read_payload(vm, f"{legacy}/{volume.volume_id}", block=False) == digest
    volume.unstage(legacy)
    assert_closed(vm_env, volume)
    assert vm_env.mapped("krbd") == ""
    assert vm.check(f"ls -A {legacy}", timeout=30).strip() == ""
    assert PASSPHRASE not in volume.plugin.log()


@pytest.mark.long  # LUKS2 staging through krbd (the case above) is in the ci tier
def test_rbd_nbd_block_opens_a_ceph_csi_header_grows_and_refuses_a_wrong_passphrase(
        vm_env: VmEnv, make_volume: Callable[..., VmVolume]) -> None:
    vm = vm_env.vm
    volume = encrypted_volume(make_volume, vm_env, "rbd-nbd", "encrypted")
    # Formatted as ceph-csi's node plugin formats it (and then marked "encrypted", as it does).
    device = map_by_hand(vm_env, volume)
    vm.check(with_passphrase(CEPH_CSI_FORMAT.format(device=device)) + f" && rbd device unmap {device}", timeout=300)

    cap = block_cap()
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    record = stage_record(vm, staging)
    assert str(record["device"]).startswith("/dev/nbd") and record["crypt_name"] == mapping(volume)
    digest = write_payload(vm, target, block=True)
    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)
    assert vm_env.mapped("nbd") == ""

    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    assert read_payload(vm, target, block=True) == digest
    before = device_bytes(vm, target)
    volume.grow(128)
    assert volume.expand(target, 128, staging) == 128 * MiB
    assert device_bytes(vm, target) == before + 64 * MiB  # the mapping follows; its header stays in front
    assert read_payload(vm, target, block=True) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)

    wrong = "not-the-passphrase-of-this-volume"
    message = expect_code(grpc.StatusCode.PERMISSION_DENIED, stage, volume, vm_env.staging(), cap, wrong)
    assert "opens no keyslot" in message and wrong not in message
    assert_closed(vm_env, volume)
    assert vm_env.mapped("nbd") == ""
    log = volume.plugin.log()
    assert PASSPHRASE not in log and wrong not in log


@pytest.mark.long  # the metadata KMS on a real kernel is also tests/e2e/test_vm_node.py's krbd claim
def test_metadata_kms_opens_with_the_unwrapped_per_volume_passphrase(
        vm_env: VmEnv, make_volume: Callable[..., VmVolume]) -> None:
    vm = vm_env.vm
    # The KMS ConfigMap as the node plugin reads it (its default path: the DaemonSet mounts it there).
    vm.check("mkdir -p /etc/ceph-csi-encryption-kms-config && echo "
             + shlex.quote(json.dumps({"meta": {"encryptionKMSType": "metadata"}}))
             + " >/etc/ceph-csi-encryption-kms-config/config.json", timeout=30)
    volume = encrypted_volume(make_volume, vm_env, "krbd", "encryptionPrepared")
    volume.context["encryptionKMSID"] = "meta"
    dek = new_passphrase()
    vm_env.cluster.admin("rbd", "image-meta", "set", f"{vm_env.cluster.pool}/{volume.image}", DEK,
                         wrap(PASSPHRASE, volume.volume_id, dek))
    cap = block_cap()
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    device = str(stage_record(vm, staging)["device"])
    digest = write_payload(vm, target, block=True)
    test_key = f"cryptsetup open --test-passphrase {device} --key-file=-"
    assert vm.run(f"printf %s {shlex.quote(dek)} | {test_key}", timeout=120).ok
    assert vm.run(with_passphrase(test_key), timeout=120).rc == 2  # the class secret only wraps the key
    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    assert read_payload(vm, target, block=True) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    assert vm_env.mapped("krbd") == ""
    log = volume.plugin.log()
    assert dek not in log and PASSPHRASE not in log
