"""The LUKS steps of staging a block-encrypted volume (ceph-csi's `encryptionType: block`), between
the map and the filesystem: format once, open, and later resize and close.

Follows ceph-csi's `rbd.csi.ceph.com/encrypted` states; formats only a blank device, under the
volume's cluster lock and only with enough lock time left (else DEADLINE_EXCEEDED); the mapping
`luks-rbd-<volume id>` is recorded before the open. Protocol and crash windows:
docs/design/node.md, "Formatting once, opening after".
"""
from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from cephcsi.encryption import volume_keys
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import CephCSIError, DeadlineExceeded, FailedPrecondition, OperationInFlight
from cephcsi.node import devices, luks
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.journal_owner import JournalOwner
from cephcsi.node.luks_keys import KeySource
from cephcsi.node.requests import StageRequest
from cephcsi.node.stage_record import StageRecord
from cephcsi.node.volume_lock import ClusterLock
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

FORMAT_WAIT = 90.0
"""How long a stage waits for another node's format (a luksFormat takes seconds; under the lock
also a few `rados`/`rbd` runs) before it gives up with ABORTED."""
FORMAT_LOCK_SECONDS = 300
"""The lapse of a format's lock: a stage killed while formatting blocks the volume this long at
most; far longer than one format (whose cryptsetup run is bounded by the command timeout)."""
FORMAT_RUNS = 2
"""Tool runs of the format itself, each bounded by the command timeout: the probe, luksFormat."""
LAPSE_MARGIN = 10.0
"""Seconds kept in hand beyond FORMAT_RUNS command timeouts before the lock lapses."""


class LuksStage:
    def __init__(self, cryptsetup: luks.Luks, keys: Callable[[], KeySource],
                 metadata: Callable[[StageRequest], RbdImageMetadata],
                 format_wait: float = FORMAT_WAIT, holder: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cryptsetup = cryptsetup
        self._keys = keys
        self.metadata = metadata
        self.format_wait = format_wait
        self.holder = holder or socket.gethostname()
        self.clock = clock

    def open(self, record: StageRecord, request: StageRequest, spec: EncryptionSpec) -> bool:
        """Make /dev/mapper/<record.crypt_name> the open LUKS device over record.device; True when
        this call opened it. The record names the mapping already (saved by the caller)."""
        active = self.cryptsetup.status(record.crypt_name)
        if active is not None:
            luks.require_backing(active, record.device, record.volume_id)
            return False
        meta = self.metadata(request)
        values = meta.read()
        state = self._known_state(values, record, request)
        passphrase = self._passphrase(values, record, request, spec, meta)
        if state == volume_keys.PREPARED and not record.read_only:
            with self._format_lock(meta, record.volume_id) as still_locked:
                # Another node may have formatted it (and even rotated its key) while this one
                # waited: the state read under the lock is the one that counts.
                values = meta.read()
                state = self._known_state(values, record, request)
                if state == volume_keys.PREPARED:
                    self._format_once(record, meta, passphrase, still_locked)
                else:
                    log.info("volume formatted by another node meanwhile; opening its header",
                             extra=fields(volume_id=record.volume_id))
                    passphrase = self._passphrase(values, record, request, spec, meta)
        elif state == volume_keys.PREPARED:
            self._format_once(record, meta, passphrase)  # read-only: never formats, so takes no lock
        if state == volume_keys.ENCRYPTED and not self.cryptsetup.is_luks(record.device):
            raise FailedPrecondition(
                f"image {request.image} of volume {record.volume_id} is marked {volume_keys.ENCRYPTED!r} but its "
                f"device {record.device} holds no LUKS header; it is not formatted again (that could hide data). "
                "Inspect the image by hand"
            )
        self.cryptsetup.open(record.device, record.crypt_name, passphrase, record.volume_id, read_only=record.read_only)
        return True

    @staticmethod
    def _known_state(values: dict[str, str], record: StageRecord, request: StageRequest) -> str:
        state = volume_keys.state_of(values)
        if state not in (volume_keys.PREPARED, volume_keys.ENCRYPTED):
            raise FailedPrecondition(
                f"volume {record.volume_id} is encrypted by its volume context, but image {request.image} has "
                f"encryption state {state or 'unset'!r} ({volume_keys.STATE_KEY}), neither "
                f"{volume_keys.PREPARED!r} nor {volume_keys.ENCRYPTED!r}; it was not created as an encrypted volume "
                "(or its CreateVolume did not finish), so it is neither formatted nor opened"
            )
        return state

    def _passphrase(self, values: dict[str, str], record: StageRecord, request: StageRequest, spec: EncryptionSpec,
                    meta: RbdImageMetadata) -> str:
        return self._keys().passphrase(values, record.volume_id, spec, request.secrets,
                                       tenant=lambda: JournalOwner.beside(meta).read(record.volume_id))

    def _format_once(self, record: StageRecord, meta: RbdImageMetadata, passphrase: str,
                     still_locked: Callable[[], None] = lambda: None) -> None:
        if record.read_only:
            if not self.cryptsetup.is_luks(record.device):
                raise FailedPrecondition(
                    f"encrypted volume {record.volume_id} was never staged for writing, so it holds no LUKS header "
                    "yet; a read-only stage never formats it. Stage it read-write once first"
                )
        else:
            # Nothing else may hold the device while it is formatted (an mkfs a killed plugin left).
            devices.require_unclaimed(record.device)
            still_locked()
            if self.cryptsetup.format(record.device, passphrase, record.volume_id):
                log.info("volume formatted with LUKS2", extra=fields(volume_id=record.volume_id))
            meta.set(volume_keys.STATE_KEY, volume_keys.ENCRYPTED)

    @contextmanager
    def _format_lock(self, meta: RbdImageMetadata, volume_id: str) -> Iterator[Callable[[], None]]:
        """Hold the volume's lock; yields the check to run right before the format (module
        docstring), which raises when the lock could lapse before the format is done."""
        # A cookie of this attempt alone: release must never break another stage's lock (two
        # plugins may share a host name, as in tests/vm/test_concurrent_format.py).
        lock = ClusterLock(meta.runner, meta.timeout, meta.image, meta.monitors, meta.credentials, volume_id,
                           f"cephcsi-format@{self.holder}/{uuid.uuid4().hex[:12]}",
                           f"cephcsi LUKS format on {self.holder}", duration=FORMAT_LOCK_SECONDS)
        taken = lock.acquire(self.format_wait, clock=self.clock)
        if taken is None:
            raise OperationInFlight(
                f"another node is formatting volume {volume_id} (or rotating its key): its lock was still held "
                f"after {self.format_wait:g} s; retry (a lock whose holder died lapses {FORMAT_LOCK_SECONDS} s "
                "after it was taken)"
            )
        needed = FORMAT_RUNS * self.cryptsetup.timeout + LAPSE_MARGIN

        def still_locked() -> None:
            left = taken + FORMAT_LOCK_SECONDS - self.clock()
            if left < needed:
                raise DeadlineExceeded(
                    f"the first LUKS format of volume {volume_id} was not started: the volume's lock, taken "
                    f"{self.clock() - taken:.0f} s ago, may lapse in {max(left, 0):.0f} s, before a format (up to "
                    f"{needed:.0f} s) would be done, and another node could then format it too. Nothing was "
                    "written; retry (the steps before the format ran slowly: check the node's load and the "
                    "Ceph cluster's health if this repeats)"
                )

        try:
            yield still_locked
        finally:
            # Another node's stage waits for a lock left here until it lapses.
            lock.release_or_lapse()

    def close(self, record: StageRecord) -> None:
        if record.crypt_name:
            self.cryptsetup.close(record.crypt_name)

    def resize(self, record: StageRecord) -> int:
        """Grow the open mapping to its RBD device's size; the mapping's size in bytes."""
        return self.cryptsetup.resize(record.crypt_name)

