"""cephcsi.node.fscrypt on a real ext4 (`-O encrypt`, a loop device) and the real kernel, checked
against google/fscrypt's own tool (Debian package `fscrypt`, the code ceph-csi links): what
cephcsi sets up, `fscrypt unlock` opens; what `fscrypt encrypt` sets up in ceph-csi's layout
(protector "ceph-csi" on <mount>/ceph-csi-encrypted), cephcsi opens.

The tool needs /etc/fscrypt.conf; it is given one through a read-only overlay on /etc inside a
private mount namespace, so the host's /etc is never written. ~5 s.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cephcsi.errors import FailedPrecondition, PermissionDenied
from cephcsi.node.fscrypt import ioctls, volume
from cephcsi.node.fscrypt.metadata_dir import MetadataDir

pytestmark = pytest.mark.integration

PASSPHRASE = "Q2VwaC1jc2kgZnNjcnlwdCB0ZXN0IGtleQ=="  # 36 chars: ceph-csi cuts it to 32
CONFIG = ('{"source":"custom_passphrase","hash_costs":{"time":"4","memory":"65536","parallelism":"1"},'
          '"options":{"padding":"32","contents":"AES_256_XTS","filenames":"AES_256_CTS","policy_version":"2"},'
          '"use_fs_keyring_for_v1_policies":true}\n')


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mount, loop devices, the filesystem keyring)"
    if not os.path.exists("/sys/fs/ext4/features/encryption"):
        return "this kernel's ext4 has no encryption support (/sys/fs/ext4/features/encryption)"
    if shutil.which("mkfs.ext4") is None or not os.path.exists("/dev/loop-control"):
        return "needs mkfs.ext4 and loop devices"
    return None


if (_reason := _why_not()) is not None:
    pytest.skip(_reason, allow_module_level=True)


@pytest.fixture
def work() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="cephcsi-fscrypt-"))
    try:
        yield root
    finally:
        subprocess.run(["umount", "-q", str(root / "mnt")], check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def mnt(work: Path) -> Path:
    image = work / "fs.img"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-O", "encrypt", str(image)], check=True)
    target = work / "mnt"
    target.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(target)], check=True)
    return target


def remount(mnt: Path) -> None:
    """A fresh mount: no key in the keyring, no cached plaintext names."""
    image = mnt.parent / "fs.img"
    subprocess.run(["umount", str(mnt)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)


def google_fscrypt(work: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    tool = shutil.which("fscrypt")
    if tool is None:
        pytest.skip("google/fscrypt's tool is not installed (Debian package fscrypt, scripts/packages.sh test)")
    conf = work / "etc"
    conf.mkdir(exist_ok=True)
    (conf / "fscrypt.conf").write_text(CONFIG)
    quiet = [] if args[0] == "status" else ["--quiet"]  # --quiet would silence status itself
    script = f'mount -t overlay overlay -o lowerdir={conf}:/etc /etc && exec "$0" "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", script, tool, *args, *quiet], input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_raw_key_volume_opens_with_google_fscrypt_and_is_ciphertext_without_the_key(work: Path, mnt: Path) -> None:
    directory = volume.unlock(str(mnt), volume.ProtectorSecret.raw(PASSPHRASE))
    assert directory == str(mnt / "ceph-csi-encrypted")
    Path(directory, "notes.txt").write_text("plain words")
    assert volume.is_unlocked(str(mnt))
    volume.lock(str(mnt))
    assert not volume.is_unlocked(str(mnt))
    remount(mnt)
    names = os.listdir(mnt / "ceph-csi-encrypted")
    assert len(names) == 1 and names[0] != "notes.txt"
    with pytest.raises(OSError):
        Path(mnt, "ceph-csi-encrypted", names[0]).read_bytes()
    # ceph-csi's key for a KMS-kept passphrase: its first 32 bytes (fscrypt takes only 32).
    key_file = work / "key"
    key_file.write_bytes(PASSPHRASE.encode()[:32])
    status = google_fscrypt(work, "status", str(mnt / "ceph-csi-encrypted"))
    assert status.returncode == 0, status.stderr
    assert 'raw key protector "ceph-csi"' in status.stdout and "policy_version:2" in status.stdout
    opened = google_fscrypt(work, "unlock", str(mnt / "ceph-csi-encrypted"), f"--key={key_file}")
    assert opened.returncode == 0, opened.stderr
    assert (mnt / "ceph-csi-encrypted" / "notes.txt").read_text() == "plain words"


def test_passphrase_volume_opens_with_google_fscrypt(work: Path, mnt: Path) -> None:
    volume.unlock(str(mnt), volume.ProtectorSecret.custom_passphrase(PASSPHRASE))
    (mnt / "ceph-csi-encrypted" / "a").write_text("from cephcsi")
    volume.lock(str(mnt))
    remount(mnt)
    wrong = google_fscrypt(work, "unlock", str(mnt / "ceph-csi-encrypted"), stdin="not it\n")
    assert wrong.returncode != 0
    opened = google_fscrypt(work, "unlock", str(mnt / "ceph-csi-encrypted"), stdin=PASSPHRASE + "\n")
    assert opened.returncode == 0, opened.stderr
    assert (mnt / "ceph-csi-encrypted" / "a").read_text() == "from cephcsi"


@pytest.mark.parametrize("source", ["custom_passphrase", "raw_key"])
def test_directory_google_fscrypt_set_up_in_ceph_csi_layout_opens_under_cephcsi(work: Path, mnt: Path,
                                                                                source: str) -> None:
    setup = google_fscrypt(work, "setup", str(mnt))
    assert setup.returncode == 0, setup.stderr
    (mnt / "ceph-csi-encrypted").mkdir()
    args = ["encrypt", str(mnt / "ceph-csi-encrypted"), f"--source={source}", "--name=ceph-csi"]
    if source == "raw_key":
        key_file = work / "key"
        key_file.write_bytes(PASSPHRASE.encode()[:32])
        made = google_fscrypt(work, *args, f"--key={key_file}")
        secret = volume.ProtectorSecret.raw(PASSPHRASE)
    else:
        made = google_fscrypt(work, *args, stdin=PASSPHRASE + "\n")
        secret = volume.ProtectorSecret.custom_passphrase(PASSPHRASE)
    assert made.returncode == 0, made.stderr
    (mnt / "ceph-csi-encrypted" / "theirs").write_text("from google/fscrypt")
    remount(mnt)
    assert not volume.is_unlocked(str(mnt))
    with pytest.raises(PermissionDenied):
        volume.unlock(str(mnt), volume.ProtectorSecret(secret.source, "another passphrase"))
    volume.unlock(str(mnt), secret)
    assert (mnt / "ceph-csi-encrypted" / "theirs").read_text() == "from google/fscrypt"


@pytest.mark.parametrize("killed_before", ["write_policy", "add_key", "set_policy"])
def test_a_setup_killed_midway_is_completed_by_the_retry(work: Path, mnt: Path, killed_before: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    class Killed(Exception):
        pass

    def kill(*_: object) -> None:
        raise Killed()

    target = MetadataDir if killed_before == "write_policy" else ioctls
    with monkeypatch.context() as patch:
        patch.setattr(target, killed_before, kill)
        with pytest.raises(Killed):
            volume.unlock(str(mnt), volume.ProtectorSecret.raw(PASSPHRASE))
    volume.unlock(str(mnt), volume.ProtectorSecret.raw(PASSPHRASE))
    (mnt / "ceph-csi-encrypted" / "f").write_text("after the retry")
    assert len(os.listdir(mnt / ".fscrypt" / "protectors")) == 1
    assert len(os.listdir(mnt / ".fscrypt" / "policies")) == 1
    volume.lock(str(mnt))
    remount(mnt)
    volume.unlock(str(mnt), volume.ProtectorSecret.raw(PASSPHRASE))
    assert (mnt / "ceph-csi-encrypted" / "f").read_text() == "after the retry"


def test_plain_files_in_the_directory_are_never_encrypted_over(mnt: Path) -> None:
    (mnt / "ceph-csi-encrypted").mkdir()
    (mnt / "ceph-csi-encrypted" / "plain").write_text("written without encryption")
    with pytest.raises(FailedPrecondition, match="not empty"):
        volume.unlock(str(mnt), volume.ProtectorSecret.raw(PASSPHRASE))
    assert (mnt / "ceph-csi-encrypted" / "plain").read_text() == "written without encryption"
