"""LUKS2 on a mapped RBD device, through cryptsetup — and nothing else (what a volume's state is,
and where its passphrase comes from, is cephcsi.node.encrypted_stage's business).

Compatible with ceph-csi's headers and `luks-rbd-<volume id>` mappings; `format` only where the
mkfs probe finds no signature, never forced; passphrases on stdin only and scrubbed from output.
docs/design/node.md, "LUKS through cryptsetup".
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from cephcsi.errors import FailedPrecondition, Internal, PermissionDenied
from cephcsi.node import filesystems
from cephcsi.node.exec import CommandFailed, Runner, tail
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DM_PREFIX = "luks-rbd-"
MAPPER_DIR = "/dev/mapper"
PBKDF_MEMORY_KIB = 32 * 1024
FORMAT_OPTIONS = ("--type", "luks2", "--hash", "sha256", "--pbkdf-memory", str(PBKDF_MEMORY_KIB))
LUKS_TYPE = "crypto_LUKS"

# cryptsetup's exit codes (cryptsetup(8), RETURN CODES).
_RC_NO_KEY = 2  # no permission: the passphrase opens no keyslot
_RC_WRONG_DEVICE = 4  # wrong device specified: not LUKS, or the mapping is not active
_RC_BUSY = 5  # the device exists already or is busy
_NO_DEVICE_MAPPER = "Cannot initialize device-mapper"


def dm_name(volume_id: str) -> str:
    """The dm-crypt mapping name of a volume, as ceph-csi names it."""
    return DM_PREFIX + volume_id


def mapper_path(name: str) -> str:
    return f"{MAPPER_DIR}/{name}"


@dataclass(frozen=True)
class Status:
    """An active mapping as `cryptsetup status` describes it."""

    name: str
    device: str
    """The backing device ('' when cryptsetup did not say)."""
    kind: str
    """"LUKS2", "LUKS1", "PLAIN"... as cryptsetup prints it."""
    sectors: int
    """The mapping's size in 512-byte sectors."""
    offset: int
    """Where the data starts on the backing device, in 512-byte sectors (the LUKS header before it)."""
    in_use: bool

    @property
    def path(self) -> str:
        return mapper_path(self.name)


def parse_status(name: str, text: str) -> Status | None:
    """`cryptsetup status` output → Status; None when the mapping is not active.

    The first line is "/dev/mapper/<name> is active." or "... is active and is in use."
    ("... is inactive." otherwise); then indented "key: value" lines (type, device, size...)."""
    lines = text.splitlines()
    if not lines or " is active" not in lines[0]:
        return None
    values: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.strip().partition(":")
        if sep:
            values[key.strip()] = value.strip()
    return Status(
        name=name,
        device=values.get("device", ""),
        kind=values.get("type", ""),
        sectors=_sectors(values.get("size", "")),
        offset=_sectors(values.get("offset", "")),
        in_use="in use" in lines[0],
    )


def _sectors(value: str) -> int:
    """"2093056 sectors" → 2093056 (0 when absent or not a number)."""
    words = value.split()
    return int(words[0]) if words and words[0].isdigit() else 0


def require_backing(active: Status, device: str, volume: str) -> None:
    """FAILED_PRECONDITION when the open mapping is not over `device` (a stale mapping of an
    earlier map of the image, whose device name the kernel has since given to another)."""
    if active.device and active.device != device:
        raise FailedPrecondition(
            f"dm-crypt mapping {active.name} of volume {volume} is open on {active.device}, not on its mapped "
            f"device {device}; close it by hand (cryptsetup close {active.name}) once nothing uses it, then retry"
        )


class Luks:
    def __init__(self, runner: Runner, timeout: float, format_options: tuple[str, ...] = FORMAT_OPTIONS) -> None:
        self.run = runner
        self.timeout = timeout
        # ceph-csi's header unless a test swaps in a cheaper PBKDF (argon2 under an emulated CPU).
        self.format_options = format_options

    def is_luks(self, device: str) -> bool:
        result = self.run(["cryptsetup", "isLuks", device], what=f"check {device} for a LUKS header",
                          timeout=self.timeout, ok_codes=(0, 1, _RC_WRONG_DEVICE))
        return result.returncode == 0

    def probe(self, device: str) -> filesystems.Probe:
        """What the device holds, by the probe that guards mkfs (blkid -p after a direct read)."""
        return filesystems.probe(self.run, device, self.timeout)

    def format(self, device: str, passphrase: str, volume: str) -> bool:
        """LUKS2-format `device` if it holds nothing at all; True when this call formatted it.

        A device that already carries a LUKS header is left as it is (False): it is opened, not
        re-created. Anything else on it is FAILED_PRECONDITION and stays untouched."""
        found = self.probe(device)
        if not found.empty:
            if found.other.startswith(LUKS_TYPE) or self.is_luks(device):
                return False
            what = found.fs_type and f"a {found.fs_type} filesystem" or found.other
            raise FailedPrecondition(
                f"volume {volume} (device {device}) is to be encrypted but already holds {what}; refusing to "
                "format it with LUKS (its data is left untouched). An unencrypted volume cannot be staged through "
                "an encrypted StorageClass: restore its data into a new encrypted volume instead"
            )
        self.run(["cryptsetup", "-q", "luksFormat", *self.format_options, "--key-file=-", device],
                 what=f"format volume {volume} (device {device}) with LUKS2", timeout=self.timeout,
                 stdin=passphrase, secrets=[passphrase])
        log.info("LUKS2 header written", extra=fields(volume_id=volume, device=device))
        return True

    def status(self, name: str) -> Status | None:
        result = self.run(["cryptsetup", "status", name], what=f"read the state of dm-crypt mapping {name}",
                          timeout=self.timeout, ok_codes=(0, 1, _RC_WRONG_DEVICE))
        if result.returncode == 1 and _NO_DEVICE_MAPPER in result.stderr:
            return None  # no device-mapper in this kernel (or not loaded): nothing can be open
        if result.returncode == 1:
            raise CommandFailed(result, f"read the state of dm-crypt mapping {name}")
        if result.returncode != 0:
            return None
        return parse_status(name, result.stdout)

    def open(self, device: str, name: str, passphrase: str, volume: str, read_only: bool = False) -> str:
        """Open `device` as /dev/mapper/<name> (idempotent); the mapper path."""
        active = self.status(name)
        if active is not None:
            require_backing(active, device, volume)
            return active.path
        argv = ["cryptsetup", "luksOpen", device, name, "--disable-keyring", "--key-file=-"]
        if read_only:
            argv.append("--readonly")
        try:
            self.run(argv,
                     what=f"open the LUKS device of volume {volume}", timeout=self.timeout,
                     stdin=passphrase, secrets=[passphrase])
        except CommandFailed as error:
            if error.returncode == _RC_NO_KEY:
                raise PermissionDenied(
                    f"the passphrase of volume {volume} opens no keyslot of the LUKS header on {device}: the key "
                    "in its KMS (or the StorageClass secret's encryptionPassphrase) is not the one it was "
                    "formatted with"
                ) from None
            if error.returncode == _RC_BUSY:
                # Opened concurrently (another process), or a stale name: only the status says which.
                active = self.status(name)
                if active is not None:
                    require_backing(active, device, volume)
                    return active.path
            raise
        log.info("LUKS device opened", extra=fields(volume_id=volume, device=device, mapping=name))
        return mapper_path(name)

    def close(self, name: str) -> None:
        """Close the mapping (nothing to do when it is not active)."""
        if self.status(name) is None:
            return
        try:
            self.run(["cryptsetup", "luksClose", name], what=f"close dm-crypt mapping {name}", timeout=self.timeout)
        except CommandFailed as error:
            if self.status(name) is None:
                return  # closed meanwhile
            if error.returncode == _RC_BUSY:
                raise FailedPrecondition(
                    f"dm-crypt mapping {name} is still in use ({tail(error.stderr, 200)}); unmount what uses it first"
                ) from None
            raise
        log.info("LUKS device closed", extra=fields(mapping=name))

    def resize(self, name: str) -> int:
        """Grow the open mapping to its backing device's size; its size in bytes afterwards."""
        self.run(["cryptsetup", "resize", name], what=f"grow dm-crypt mapping {name}", timeout=self.timeout)
        active = self.status(name)
        if active is None:
            raise Internal(f"dm-crypt mapping {name} is gone after cryptsetup resize")
        return active.sectors * 512
