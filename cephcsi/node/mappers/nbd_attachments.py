"""What the node plugin needs to re-attach an rbd-nbd device after it restarted, kept on tmpfs.

One record per netlink-bound device, `<runtime-dir>/nbd/<sha256(volume id)[:16]>.json` (0600,
in a 0700 directory), holding image, monitors, map options and the cephx key; written right
after the map, removed by the unmap. Why a key is kept: docs/design/node.md, "Re-attaching".
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field

from cephcsi.ceph.credentials import Credentials
from cephcsi.node.stage_record import ImageSpec
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

SUBDIR = "nbd"
VERSION = 1


@dataclass(frozen=True)
class Attachment:
    volume_id: str
    pool: str
    namespace: str
    image: str
    device: str
    cookie: str
    """/sys/block/nbdX/backend right after the map: tells our device from one the kernel gave to
    another mapping after ours timed out."""
    monitors: str
    options: list[str]
    """The map options the device was mapped with (defaults and mapOptions merged)."""
    read_only: bool
    user_id: str
    key: str = field(repr=False)
    log_file: str = ""
    reattach_failed: bool = False
    """Set when a restarted plugin tried and failed: NodeStageVolume then stages afresh instead of
    waiting for a re-attach (a later plugin start still tries again)."""
    version: int = VERSION

    @property
    def image_spec(self) -> ImageSpec:
        return ImageSpec(self.pool, self.image, self.namespace)

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.user_id, self.key)


class AttachmentStore:
    def __init__(self, state_dir: str) -> None:
        self.root = os.path.join(state_dir, SUBDIR) if state_dir else ""

    def path(self, volume_id: str) -> str:
        return os.path.join(self.root, hashlib.sha256(volume_id.encode()).hexdigest()[:16] + ".json")

    def save(self, attachment: Attachment) -> None:
        """Atomically, 0600. A failure is logged, not raised: the volume is mapped and usable;
        only a re-attach after a plugin restart is lost."""
        if not self.root:
            return
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.chmod(self.root, 0o700)
            fd, tmp = tempfile.mkstemp(prefix=".attach-", suffix=".tmp", dir=self.root)
            try:
                os.fchmod(fd, 0o600)
                os.write(fd, json.dumps(asdict(attachment), sort_keys=True).encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path(attachment.volume_id))
        except OSError as error:
            log.error("cannot keep the rbd-nbd re-attach record: the volume works, but will not be re-attached "
                      "if the plugin restarts", extra=fields(volume_id=attachment.volume_id, error=error.strerror))

    def remove(self, volume_id: str) -> None:
        if not self.root:
            return
        try:
            os.unlink(self.path(volume_id))
        except FileNotFoundError:
            pass

    def load(self, volume_id: str) -> Attachment | None:
        return self._read(self.path(volume_id)) if self.root else None

    def all(self) -> list[Attachment]:
        if not self.root:
            return []
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            if name.endswith(".json"):
                attachment = self._read(os.path.join(self.root, name))
                if attachment is not None:
                    found.append(attachment)
        return found

    @staticmethod
    def _read(path: str) -> Attachment | None:
        try:
            with open(path, encoding="utf-8") as handle:
                doc = json.load(handle)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError("unknown format")
            return Attachment(**doc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as error:
            # Never the content: it holds a key.
            log.error("unreadable rbd-nbd re-attach record ignored", extra=fields(path=path, error=type(error).__name__))
            return None
