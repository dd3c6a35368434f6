"""Key rotation of a LUKS2 block-encrypted volume: a new passphrase in the header and in the KMS,
the old one gone from both, done where the volume is staged (`cephcsi rotate-key`).

Only keyslots change (slot 0 the passphrase, slot 1 a backup during a rotation, as ceph-csi);
between any two steps the KMS passphrase opens a slot, and a re-run completes a killed one.
Rotations exclude each other by flock and ceph-csi's `<volume id>-mutexlock`; the `default`
KMS cannot rotate. Steps and proof: docs/design/node.md, "Rotating a LUKS key".
"""
from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption import volume_keys
from cephcsi.encryption.kms.base import Kms
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, OperationInFlight
from cephcsi.node import luks, stage_record
from cephcsi.node.exec import CommandFailed, Runner
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.volume_lock import LOCK_SECONDS, ClusterLock
from cephcsi.observability.logging import fields
from cephcsi.volumes import failpoints

log = logging.getLogger(__name__)

PRIMARY = 0
"""The slot the volume's passphrase lives in (luksFormat's first slot)."""
BACKUP = 1
"""The slot the KMS's passphrase is copied to while a rotation runs."""
_RC_NO_KEY = 2
_ADD_OPTIONS = ("--pbkdf-memory", str(luks.PBKDF_MEMORY_KIB))
"""cephcsi's format cap on argon2's memory (cephcsi.node.luks), for a header whose KDF is unknown."""


class Keyslots(Protocol):
    """The LUKS header operations a rotation needs (cryptsetup; a fake in the ordering's unit tests)."""

    def active(self) -> set[int]: ...

    def opens(self, passphrase: str, slot: int | None = None) -> bool:
        """Whether the passphrase opens `slot` (any slot when None)."""
        ...

    def add(self, existing: str, new: str, slot: int) -> None: ...

    def kill(self, existing: str, slot: int) -> None:
        """Clear `slot`, authorised by `existing` (which must open another slot)."""
        ...


class KeyStore(Protocol):
    """The volume's passphrase as its KMS keeps it."""

    def current(self) -> str: ...

    def replace(self, passphrase: str) -> None: ...


def rotate(slots: Keyslots, store: KeyStore, new_passphrase: Callable[[], str], volume_id: str,
           reach: Callable[[str], None] = failpoints.reach, still_locked: Callable[[], None] = lambda: None) -> None:
    """The five steps of the module docstring, in that order. `still_locked` raises when the
    cluster lock may have lapsed: the KMS write is the one step another rotation must not race."""
    old = store.current()
    active = slots.active()
    if not (BACKUP in active and slots.opens(old, BACKUP)):
        if not slots.opens(old):
            raise FailedPrecondition(
                f"the passphrase the KMS keeps for volume {volume_id} opens no keyslot of its LUKS header; nothing "
                "was changed. Stage the volume to see whether it opens at all, and restore the KMS's key"
            )
        if BACKUP in active:
            slots.kill(old, BACKUP)  # a stale backup: the KMS passphrase opens another slot (just checked)
        slots.add(old, old, BACKUP)
    reach("key-rotation.after-backup")
    if PRIMARY in slots.active():
        slots.kill(old, PRIMARY)
    new = new_passphrase()
    slots.add(old, new, PRIMARY)
    reach("key-rotation.after-new-slot")
    if not slots.opens(new, PRIMARY):
        raise Internal(f"the new passphrase of volume {volume_id} does not open the slot it was just added to; "
                       "the KMS still holds the old one (which opens slot 1): rerun the rotation")
    for slot in sorted(slots.active() - {PRIMARY, BACKUP}):
        if slots.opens(old, slot):  # another copy of the old passphrase (a recovery key stays)
            slots.kill(new, slot)
    still_locked()
    store.replace(new)
    log.info("volume passphrase replaced in the KMS", extra=fields(volume_id=volume_id))
    reach("key-rotation.after-kms")
    if BACKUP in slots.active():
        slots.kill(new, BACKUP)
    log.info("volume key rotated", extra=fields(volume_id=volume_id))


# -- cryptsetup ----------------------------------------------------------------------------------


@contextmanager
def _new_key_file(passphrase: str) -> Iterator[str]:
    """The new passphrase in a 0600 file of a 0700 directory (tmpfs /run when there), removed at once."""
    parent = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else None
    directory = tempfile.mkdtemp(prefix="cephcsi-rotate-", dir=parent)
    path = os.path.join(directory, "key")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, passphrase.encode())
        finally:
            os.close(fd)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def kdf_options(keyslots: Mapping[int, Mapping[str, object]], target: int) -> list[str]:
    """cryptsetup options giving a new slot the PBKDF of the header's own (slot 0 or 1 first, not
    `target`): the same type and cost, no benchmark. A rotation then neither weakens the header nor
    makes it costlier to open on the nodes that open it today, and a benchmark on a busy node
    (fewer iterations) cannot pick a weaker cost. An unknown KDF gets cephcsi's format settings."""
    others = sorted(keyslots.keys() - {target}, key=lambda slot: (slot not in (PRIMARY, BACKUP), slot))
    kdf = keyslots[others[0]].get("kdf") if others else None
    if isinstance(kdf, Mapping):
        kind = kdf.get("type")
        if kind == "pbkdf2" and isinstance(kdf.get("iterations"), int) and isinstance(kdf.get("hash"), str):
            return ["--pbkdf", "pbkdf2", "--hash", str(kdf["hash"]), "--pbkdf-force-iterations", str(kdf["iterations"])]
        if kind in ("argon2i", "argon2id") and all(isinstance(kdf.get(k), int) for k in ("time", "memory", "cpus")):
            return ["--pbkdf", str(kind), "--pbkdf-force-iterations", str(kdf["time"]),
                    "--pbkdf-memory", str(kdf["memory"]), "--pbkdf-parallel", str(kdf["cpus"])]
    return list(_ADD_OPTIONS)


@dataclass(frozen=True)
class CryptsetupSlots:
    """Keyslots of the LUKS2 header on `device`, through cryptsetup."""

    runner: Runner = field(repr=False)
    timeout: float
    device: str
    volume_id: str

    def _keyslots(self) -> dict[int, dict[str, object]]:
        result = self.runner(["cryptsetup", "luksDump", "--dump-json-metadata", self.device],
                             what=f"read the LUKS2 keyslots of volume {self.volume_id}", timeout=self.timeout)
        try:
            return {int(slot): dict(value) for slot, value in json.loads(result.stdout)["keyslots"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise Internal(f"cryptsetup printed no LUKS2 keyslots for {self.device} (volume {self.volume_id}); "
                           "is its header LUKS1?") from None

    def active(self) -> set[int]:
        return set(self._keyslots())

    def opens(self, passphrase: str, slot: int | None = None) -> bool:
        argv = ["cryptsetup", "open", "--test-passphrase", "--key-file=-", self.device]
        if slot is not None:
            argv[2:2] = ["--key-slot", str(slot)]
        result = self.runner(argv, what=f"test a passphrase of volume {self.volume_id}", timeout=self.timeout,
                             ok_codes=(0, _RC_NO_KEY), stdin=passphrase, secrets=[passphrase])
        return result.returncode == 0

    def add(self, existing: str, new: str, slot: int) -> None:
        options = kdf_options(self._keyslots(), slot)
        with _new_key_file(new) as path:
            self.runner(["cryptsetup", "luksAddKey", "--key-slot", str(slot), *options, "--key-file=-",
                         self.device, path],
                        what=f"add keyslot {slot} to the LUKS header of volume {self.volume_id}",
                        timeout=self.timeout, stdin=existing, secrets=[existing, new])
        log.info("LUKS keyslot added", extra=fields(volume_id=self.volume_id, slot=slot))

    def kill(self, existing: str, slot: int) -> None:
        self.runner(["cryptsetup", "luksKillSlot", "--key-file=-", self.device, str(slot)],
                    what=f"clear keyslot {slot} of the LUKS header of volume {self.volume_id}",
                    timeout=self.timeout, stdin=existing, secrets=[existing])
        log.info("LUKS keyslot cleared", extra=fields(volume_id=self.volume_id, slot=slot))


# -- the KMS -------------------------------------------------------------------------------------


def refuse_default(spec: EncryptionSpec) -> None:
    if spec.is_default_kms:
        raise InvalidArgument(
            "volumes of the default KMS (no encryptionKMSID) cannot rotate their key: their passphrase is the "
            "StorageClass Secret's encryptionPassphrase, shared by every volume of the class, and nothing per "
            "volume is kept. Use a KMS that keeps a passphrase per volume (metadata, vault) for new volumes"
        )


@dataclass
class KmsKeyStore:
    """The passphrase as NodeStage reads it (cephcsi.node.luks_keys), written back the same way."""

    kms: Kms
    metadata: RbdImageMetadata
    volume_id: str

    def current(self) -> str:
        if not self.kms.dek_in_image:
            found = self.kms.fetch(self.volume_id)
            if found is None:
                raise FailedPrecondition(f"{self.kms.describe()} keeps no passphrase for volume {self.volume_id}")
            return found
        wrapped = volume_keys.wrapped_dek_of(self.metadata.read())
        if not wrapped:
            raise FailedPrecondition(f"encrypted volume {self.volume_id} has no passphrase in its image metadata "
                                     f"({volume_keys.DEK_KEY})")
        return self.kms.unwrap(self.volume_id, wrapped)

    def replace(self, passphrase: str) -> None:
        if not self.kms.dek_in_image:
            self.kms.store(self.volume_id, passphrase)
            return
        self.metadata.set_secret(volume_keys.DEK_KEY, self.kms.wrap(self.volume_id, passphrase))


@contextmanager
def node_lock(directory: str, volume_id: str) -> Iterator[None]:
    """One rotation of a volume at a time on this node (a second one fails at once)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(directory, f"rotate-key-{volume_id}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OperationInFlight(f"another key rotation of volume {volume_id} is running on this node") from None
        yield
    finally:
        os.close(fd)


# -- where the volume is staged ------------------------------------------------------------------

_STAGE_GLOBS = ("plugins/kubernetes.io/csi/*/*/globalmount", "plugins/kubernetes.io/csi/pv/*/globalmount",
                "plugins/kubernetes.io/csi/volumeDevices/staging/*")
"""kubelet's staging paths (driver/<sha256>/globalmount since Kubernetes 1.24, pv/<name>/globalmount
before, volumeDevices/staging/<pv> for Block); only these levels are listed, never a volume's files."""


def find_stage(kubelet_dir: str, volume_id: str, staging_path: str = "") -> stage_record.StageRecord:
    """The stage record of a staged, encrypted volume on this node (FAILED_PRECONDITION otherwise)."""
    if staging_path:
        candidates = [staging_path]
    else:
        candidates = sorted({path for pattern in _STAGE_GLOBS for path in glob.glob(os.path.join(kubelet_dir, pattern))})
    for path in candidates:
        record = stage_record.load(path)
        if record is None or record.volume_id != volume_id:
            continue
        if not (record.staged and record.crypt_name and record.device):
            raise FailedPrecondition(f"volume {volume_id} is staged at {path} but not (or not completely) as an "
                                     "encrypted volume; only a staged LUKS volume can rotate its key")
        if record.read_only:
            raise FailedPrecondition(f"volume {volume_id} is staged read-only at {path}, so its LUKS header cannot "
                                     "be written here; run the rotation on a node that stages it read-write")
        return record
    where = staging_path or f"{kubelet_dir}/plugins/kubernetes.io/csi"
    raise FailedPrecondition(f"volume {volume_id} is not staged on this node (no cephcsi stage record under {where}); "
                             "run the rotation in the node plugin of a node where a pod uses it")


# -- one rotation of a volume at a time, across nodes ---------------------------------------------

LOCK_MARGIN = 60.0
"""No KMS write later than this before the lock lapses."""


@dataclass(frozen=True)
class RotationLock:
    """The volume's cluster lock (cephcsi.node.volume_lock) as a rotation on `host` holds it."""

    runner: Runner = field(repr=False)
    timeout: float
    image: stage_record.ImageSpec
    monitors: str
    credentials: Credentials = field(repr=False)
    volume_id: str
    host: str

    @property
    def cookie(self) -> str:
        return f"cephcsi-rotate-key@{self.host}"

    @property
    def lock(self) -> ClusterLock:
        return ClusterLock(self.runner, self.timeout, self.image, self.monitors, self.credentials, self.volume_id,
                           self.cookie, f"cephcsi rotate-key on {self.host}")

    @contextmanager
    def held(self) -> Iterator[Callable[[], None]]:
        """Hold the lock (call only under this host's node_lock); yields the check to run before the
        KMS write."""
        lock = self.lock
        if not lock.take():
            lockers = lock.lockers()
            others = [f"{l.get('name')} ({l.get('description') or l.get('cookie')})" for l in lockers
                      if l.get("cookie") != self.cookie]
            if others:
                raise OperationInFlight(
                    f"another key rotation or LUKS format of volume {self.volume_id} holds its lock "
                    f"({', '.join(others)}): on another node, or by ceph-csi. Retry when it is done; a lock whose "
                    "holder died "
                    f"lapses {LOCK_SECONDS} s after it was taken"
                )
            for locker in lockers:  # this host's: its run is dead, since this run holds the host's flock
                log.info("breaking the key rotation lock a killed run of this node left",
                         extra=fields(volume_id=self.volume_id, locker=locker.get("name", "")))
                lock.break_locker(locker.get("name", ""))
            if not lock.take():
                raise OperationInFlight(f"the key rotation lock of volume {self.volume_id} was taken meanwhile")
        lapse = time.monotonic() + LOCK_SECONDS - LOCK_MARGIN

        def still_locked() -> None:
            if time.monotonic() > lapse:
                raise DeadlineExceeded(
                    f"the key rotation of volume {self.volume_id} ran so long that its lock may lapse; the KMS was "
                    "not changed and its passphrase still opens the volume: rerun the rotation"
                )

        try:
            yield still_locked
        finally:
            lock.release_or_lapse()
