"""Volume (and, later, snapshot) ids: everything needed to find the image without a search.

    0001-<clusterID length, 4 hex>-<clusterID>-<pool id, 16 hex>-<uuid>

The layout is ceph-csi's, so ids it issued decode here too. At most 128 bytes (CSI limit
kubelet enforces on volume handles): 4+1+4+1+36+1+16+1+36 = 100 with the longest clusterID.
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from cephcsi.config.clusters import CLUSTER_ID_PATTERN

VERSION = 1
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MAX_ID_LENGTH = 128


class MalformedId(ValueError):
    """The string is not an id this driver issues. DeleteVolume treats it as already gone."""


@dataclass(frozen=True)
class VolumeId:
    cluster_id: str
    pool_id: int
    object_uuid: str

    def encode(self) -> str:
        return f"{VERSION:04x}-{len(self.cluster_id):04x}-{self.cluster_id}-{self.pool_id:016x}-{self.object_uuid}"

    def __str__(self) -> str:
        return self.encode()

    @staticmethod
    def new_uuid() -> str:
        return str(uuid.uuid4())

    @classmethod
    def decode(cls, text: str) -> VolumeId:
        if not text or len(text) > MAX_ID_LENGTH:
            raise MalformedId(f"id must be 1-{MAX_ID_LENGTH} bytes")
        try:
            version = int(text[0:4], 16)
            if text[4] != "-" or version != VERSION:
                raise MalformedId(f"unsupported id version {text[0:4]!r}")
            length = int(text[5:9], 16)
            if text[9] != "-":
                raise MalformedId("bad separator after cluster id length")
            cluster_id = text[10 : 10 + length]
            rest = text[10 + length :]
        except (ValueError, IndexError):
            raise MalformedId("not a cephcsi id") from None
        if not CLUSTER_ID_PATTERN.match(cluster_id) or len(cluster_id) != length:
            raise MalformedId("bad cluster id")
        if len(rest) != 1 + 16 + 1 + 36 or rest[0] != "-" or rest[17] != "-":
            raise MalformedId("bad pool id or uuid")
        try:
            pool_id = int(rest[1:17], 16)
        except ValueError:
            raise MalformedId("bad pool id") from None
        object_uuid = rest[18:]
        if not _UUID.match(object_uuid):
            raise MalformedId("bad uuid")
        return cls(cluster_id, pool_id, object_uuid)
