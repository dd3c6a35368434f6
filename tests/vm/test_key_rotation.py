"""Key rotation of a LUKS2 volume on a real kernel (krbd, Block, the `metadata` KMS): `cephcsi
rotate-key` run in the node's environment as `kubectl exec` runs it in the plugin container, the
Secret on stdin. After a rotation the old passphrase opens no keyslot, the new one (unwrapped from
the image metadata, where the KMS keeps it) opens slot 0 and nothing else is left, and the data
reads back through unstage and restage (the header is formatted with a cheap PBKDF, which new
slots copy, so the test's many cryptsetup runs are fast under TCG). A rotation SIGKILLed after the new slot is added and
before the KMS is updated leaves a volume that restages with the KMS's (old) passphrase; its
re-run completes (breaking the lock the killed run left); a rotation another node holds the
lock for is refused. No passphrase reaches the plugin's log or the command's output."""
from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable

import pytest

from cephcsi.encryption.kms.secrets import unwrap, wrap
from cephcsi.encryption.volume_keys import DEK_KEY, new_passphrase
from tests.vm.conftest import VmEnv, VmVolume, block_cap
from tests.vm.guestio import read_payload, stage_record, write_payload
from tests.vm.machine import GUEST_VENV_PYTHON, Result
from tests.vm.plugin import KUBELET_DIR, RUNTIME_DIR
from tests.vm.test_encrypted_stage import PASSPHRASE, assert_closed, encrypted_volume, map_by_hand, stage

# In the long tier (minutes under TCG), out of CI's 90 minutes.
pytestmark = [pytest.mark.vm, pytest.mark.ceph, pytest.mark.long, pytest.mark.timeout(900)]

KMS_ID = "meta"
CHEAP_FORMAT = "cryptsetup -q luksFormat --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file=-"


def rotate_key(vm_env: VmEnv, volume: VmVolume, failpoint: str = "") -> Result:
    vm = vm_env.vm
    secret = {"apiVersion": "v1", "kind": "Secret", "stringData": {**vm_env.cluster.secrets,
                                                                    "encryptionPassphrase": PASSPHRASE}}
    with open(vm.host_path("rotate-secret.json"), "w", encoding="utf-8") as handle:
        json.dump(secret, handle)
    env = f"CEPHCSI_FAILPOINTS={failpoint} " if failpoint else ""
    repo = shlex.quote(vm.repo)
    argv = [GUEST_VENV_PYTHON, "-m", "cephcsi", "rotate-key", f"--volume-id={volume.volume_id}",
            f"--kms-id={KMS_ID}", f"--config-file={vm.guest_path('config.json')}", f"--kubelet-dir={KUBELET_DIR}",
            f"--runtime-dir={RUNTIME_DIR}", "--log-level=debug"]  # every command's argv in its log
    try:
        return vm.run(f"cd {repo} && env PYTHONPATH={repo} PYTHONDONTWRITEBYTECODE=1 {env}{shlex.join(argv)} "
                      f"<{vm.guest_path('rotate-secret.json')}", timeout=600)
    finally:
        vm.check(f"rm -f {vm.guest_path('rotate-secret.json')}", timeout=30)


def wrapped_dek(vm_env: VmEnv, volume: VmVolume) -> str:
    return vm_env.cluster.admin("rbd", "image-meta", "get", f"{vm_env.cluster.pool}/{volume.image}", DEK_KEY).strip()


def kms_passphrase(vm_env: VmEnv, volume: VmVolume) -> str:
    return unwrap(PASSPHRASE, volume.volume_id, wrapped_dek(vm_env, volume), "test")


def opens(vm_env: VmEnv, device: str, passphrase: str) -> bool:
    result = vm_env.vm.run(f"printf %s {shlex.quote(passphrase)} | cryptsetup open --test-passphrase {device} "
                           "--key-file=-", timeout=180)
    assert result.rc in (0, 2), result
    return result.rc == 0


def lockers(vm_env: VmEnv, volume: VmVolume) -> list[dict[str, str]]:
    """Who holds the volume's rotation lock ([] when nobody, or no lock object yet)."""
    result = subprocess.run(vm_env.cluster.cli("rados", "-p", vm_env.cluster.pool, "lock", "info", volume.volume_id,
                                               f"{volume.volume_id}-mutexlock", "--format", "json"),
                            capture_output=True, text=True, timeout=60, check=False)
    return list(json.loads(result.stdout)["lockers"]) if result.returncode == 0 else []


def keyslots(vm_env: VmEnv, device: str) -> list[str]:
    dump = vm_env.vm.check(f"cryptsetup luksDump --dump-json-metadata {device}", timeout=60)
    return sorted(json.loads(dump)["keyslots"])


def test_rotation_replaces_the_passphrase_and_a_rerun_after_a_kill_completes(
        vm_env: VmEnv, make_volume: Callable[..., VmVolume]) -> None:
    vm = vm_env.vm
    vm.check("mkdir -p /etc/ceph-csi-encryption-kms-config && echo "
             + shlex.quote(json.dumps({KMS_ID: {"encryptionKMSType": "metadata"}}))
             + " >/etc/ceph-csi-encryption-kms-config/config.json", timeout=30)
    volume = encrypted_volume(make_volume, vm_env, "krbd", "encrypted")
    volume.context["encryptionKMSID"] = KMS_ID
    first = new_passphrase()
    vm_env.cluster.admin("rbd", "image-meta", "set", f"{vm_env.cluster.pool}/{volume.image}", DEK_KEY,
                         wrap(PASSPHRASE, volume.volume_id, first))
    # Formatted by hand with a cheap PBKDF, which the rotation's new slots copy: argon2 calibrated
    # to 2 s per unlock would make each of a rotation's ten cryptsetup runs seconds long under TCG.
    mapped = map_by_hand(vm_env, volume)
    vm.check(f"printf %s {shlex.quote(first)} | {CHEAP_FORMAT} {mapped} && rbd device unmap {mapped}", timeout=180)
    cap = block_cap()
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    device = str(stage_record(vm, staging)["device"])
    digest = write_payload(vm, target, block=True)

    # A rotation another node (or ceph-csi) runs holds ceph-csi's lock: refused, nothing changed.
    pool, lock = vm_env.cluster.pool, f"{volume.volume_id}-mutexlock"
    vm_env.cluster.admin("rados", "-p", pool, "lock", "get", volume.volume_id, lock, "--lock-cookie", "elsewhere",
                         "--lock-duration", "120")
    refused = rotate_key(vm_env, volume)
    assert refused.rc == 1 and "holds its lock" in refused.stderr, refused
    assert kms_passphrase(vm_env, volume) == first and keyslots(vm_env, device) == ["0"]
    holder = [locker["name"] for locker in lockers(vm_env, volume) if locker["cookie"] == "elsewhere"]
    vm_env.cluster.admin("rados", "-p", pool, "lock", "break", volume.volume_id, lock, *holder,
                         "--lock-cookie", "elsewhere")

    done = rotate_key(vm_env, volume)
    assert done.ok, done
    second = kms_passphrase(vm_env, volume)
    # The new wrapped passphrase went to the image metadata from stdin: the debug log shows the
    # write's command line, and neither it nor anything else the rotation logged holds the value.
    assert "setomapval" in done.stderr and wrapped_dek(vm_env, volume) not in done.stdout + done.stderr
    assert second != first and not opens(vm_env, device, first) and opens(vm_env, device, second)
    assert keyslots(vm_env, device) == ["0"]
    assert read_payload(vm, target, block=True) == digest  # the open mapping never noticed

    # Killed after the new slot, before the KMS: the KMS still holds `second`, which still opens.
    killed = rotate_key(vm_env, volume, "key-rotation.after-new-slot")
    assert not killed.ok, killed
    assert kms_passphrase(vm_env, volume) == second and keyslots(vm_env, device) == ["0", "1"]
    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)
    staging, target = vm_env.staging(), vm_env.target()
    stage(volume, staging, cap)
    volume.publish(staging, target, cap)
    device = str(stage_record(vm, staging)["device"])
    assert read_payload(vm, target, block=True) == digest

    done = rotate_key(vm_env, volume)  # breaks the lock the killed run of this node left
    assert done.ok, done
    third = kms_passphrase(vm_env, volume)
    assert third not in (first, second) and keyslots(vm_env, device) == ["0"]
    assert not opens(vm_env, device, second) and opens(vm_env, device, third)
    assert read_payload(vm, target, block=True) == digest
    volume.unpublish(target)
    volume.unstage(staging)
    assert_closed(vm_env, volume)
    assert vm_env.mapped("krbd") == ""
    assert vm.check("ls /run | grep -c cephcsi-rotate- || true", timeout=30).strip() == "0"
    assert lockers(vm_env, volume) == []
    said = volume.plugin.log() + done.stdout + done.stderr + killed.stdout + killed.stderr
    for passphrase in (first, second, third, PASSPHRASE):
        assert passphrase not in said
