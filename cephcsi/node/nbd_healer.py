"""Re-attach rbd-nbd devices whose daemons died with the previous node plugin (ceph/ceph-csi#2204).

At start, in a thread, each re-attach record's device is left alone (still served), re-attached
(`rbd device attach`: still bound with our cookie) or reported gone with an ERROR; each volume's
lock is held while it is handled. docs/design/node.md, "Re-attaching rbd-nbd".
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from cephcsi.errors import CephCSIError, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mappers.nbd_attachments import Attachment
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

LOCK_WAIT = 120.0


@dataclass
class HealReport:
    serving: list[str] = field(default_factory=list)
    reattached: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


class NbdHealer:
    def __init__(self, mapper: NbdMapper, locks: KeyLocks, lock_wait: float = LOCK_WAIT) -> None:
        self.mapper = mapper
        self.locks = locks
        self.lock_wait = lock_wait
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """heal() in a daemon thread: the plugin serves meanwhile (liveness, other volumes)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nbd-healer", daemon=True)
            self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            report = self.heal()
        except Exception as error:  # noqa: BLE001 - a healer failure must not take the plugin down
            log.error("re-attaching rbd-nbd devices failed", extra=fields(error=str(error)))
            return
        if report.reattached or report.lost or report.failed:
            log.info("rbd-nbd re-attach pass done", extra=fields(
                reattached=len(report.reattached), lost=len(report.lost), failed=len(report.failed),
                serving=len(report.serving)))

    def heal(self) -> HealReport:
        report = HealReport()
        for attachment in self.mapper.attachments.all():
            self._wait_until_free(attachment.volume_id)
            try:
                with self.locks.hold(attachment.volume_id):
                    # Re-read under the lock: an unstage may have removed it meanwhile.
                    current = self.mapper.attachments.load(attachment.volume_id)
                    if current is not None:
                        self._heal_one(current, report)
            except OperationInFlight:
                report.failed.append(attachment.volume_id)
                log.error("volume busy for too long; its rbd-nbd device was not checked for re-attach",
                          extra=fields(volume_id=attachment.volume_id, device=attachment.device))
        return report

    def _heal_one(self, attachment: Attachment, report: HealReport) -> None:
        volume_id, device = attachment.volume_id, attachment.device
        if self.mapper.served(attachment):
            report.serving.append(volume_id)
            return
        if not self.mapper.waiting(attachment):
            report.lost.append(volume_id)
            log.error(
                "the rbd-nbd device of this volume is gone: its daemon died with the previous plugin and the device "
                "was disconnected in the kernel before it could be re-attached. I/O on the volume "
                "fails on this node; restart the pods using it, so that it is unstaged and staged again",
                extra=fields(volume_id=volume_id, device=device, image=str(attachment.image_spec)),
            )
            self.mapper.attachments.remove(volume_id)
            return
        try:
            self.mapper.reattach(attachment)
        except CephCSIError as error:
            report.failed.append(volume_id)
            # E.g. the device was disconnected while something held it open: the kernel keeps its
            # backend and cookie but refuses a new connection (EINVAL, seen on Linux 6.1).
            log.error(
                "re-attaching the rbd-nbd device of this volume failed, so its I/O fails (or stalls until "
                "reattach-timeout) on this node; restart the pods using it, so that it is unstaged and staged "
                "again (the next plugin start retries the re-attach)",
                extra=fields(volume_id=volume_id, device=device, error=str(error)),
            )
            self.mapper.attachments.save(replace(attachment, reattach_failed=True))
            return
        report.reattached.append(volume_id)

    def _wait_until_free(self, volume_id: str) -> None:
        deadline = time.monotonic() + self.lock_wait
        while self.locks.busy(volume_id) and time.monotonic() < deadline:
            time.sleep(0.2)
