"""The tenant of a volume (the claim's namespace) as the node reads it: the journal record's
`csi.volume.owner`, written by CreateVolume of an encrypted volume (ours and ceph-csi's).

One `rados getomapval` run in the image's pool, the key in a 0600 file; a volume journaled in
another pool (ceph-csi's split journal) reads as tenant "". docs/design/node.md.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from cephcsi.ceph.credentials import Credentials, key_file
from cephcsi.node.exec import CommandFailed, Runner
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.mappers.rbd_cli import translate
from cephcsi.node.stage_record import ImageSpec
from cephcsi.observability.logging import fields
from cephcsi.volumes.volume_id import MalformedId, VolumeId

log = logging.getLogger(__name__)

RECORD_PREFIX = "csi.volume."
OWNER_KEY = "csi.volume.owner"
"""The same names as cephcsi.volumes.journal (which the node does not import: it needs librados)."""

_NO_KEY = "No such key"
_NO_OBJECT = "(2) No such file or directory"


def record_object(volume_id: str) -> str | None:
    """The record object of a volume id either driver issued; None for any other id (a static
    volume's handle is its image name: it has no record)."""
    try:
        return RECORD_PREFIX + VolumeId.decode(volume_id).object_uuid
    except MalformedId:
        return None


@dataclass(frozen=True)
class JournalOwner:
    """Reads `csi.volume.owner` of one volume with the stage's credentials."""

    runner: Runner = field(repr=False)
    timeout: float
    image: ImageSpec
    """The pool (and RADOS namespace) holding the record: the image's."""
    monitors: str
    credentials: Credentials = field(repr=False)

    @classmethod
    def beside(cls, meta: RbdImageMetadata) -> JournalOwner:
        """The reader for the record in the pool of the image `meta` reads, with its credentials."""
        return cls(meta.runner, meta.timeout, meta.image, meta.monitors, meta.credentials)

    def read(self, volume_id: str) -> str:
        """The tenant; "" when the record or its owner key is absent (a volume created without
        a claim namespace, or a static volume)."""
        obj = record_object(volume_id)
        if obj is None:
            # A KMS setting relative to the tenant then says what it misses, naming the setting.
            log.info("volume id names no journal record, so no owner", extra=fields(volume_id=volume_id))
            return ""
        what = f"read the owner of volume {volume_id} from its journal record {self.image.pool}/{obj}"
        argv = ["rados", "--pool", self.image.pool]
        if self.image.namespace:
            argv += ["--namespace", self.image.namespace]
        with key_file(self.credentials) as keyfile:
            argv += ["--id", self.credentials.user_id, "-m", self.monitors, f"--keyfile={keyfile}",
                     # "-": the raw value on stdout (without it rados prints a hexdump)
                     "getomapval", obj, OWNER_KEY, "-"]
            try:
                result = self.runner(argv, what=what, timeout=self.timeout, ok_codes=(0, 1),
                                     secrets=(self.credentials.key,))
            except CommandFailed as error:
                raise translate(error, what, self.image) from None
        if result.returncode == 0:
            return result.stdout.strip()
        if _NO_KEY in result.stdout or _NO_OBJECT in result.stderr:
            log.info("volume has no owner in its journal record", extra=fields(volume_id=volume_id, object=obj))
            return ""
        raise translate(CommandFailed(result, what), what, self.image)
