"""What every mapper (krbd, rbd-nbd, fuse) provides: turn an RBD image into a block device on
this node and back.

`map` returns the device (the existing one when already mapped for the record), `find`
re-derives it when a crash lost it, `unmap` is idempotent; keys reach the tools in a 0600 key
file removed once they have connected. docs/design/node.md, "Mappers".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from cephcsi.ceph.credentials import Credentials
from cephcsi.node.stage_record import ImageSpec, StageRecord

KRBD = "krbd"
NBD = "rbd-nbd"
FUSE = "fuse"
MAPPERS = (KRBD, NBD, FUSE)


@dataclass(frozen=True)
class MapRequest:
    volume_id: str
    image: ImageSpec
    monitors: str
    """mon_host value: comma-separated monitor addresses."""
    credentials: Credentials
    options: list[str] = field(default_factory=list)
    """Mapper options from mapOptions, already chosen for this mapper."""
    read_only: bool = False
    work_dir: str = ""
    """Mapper-private directory decided before mapping (recorded first, so unstage can find it)."""
    crush_location: tuple[tuple[str, str], ...] = ()
    """This node's CRUSH location when the cluster's readAffinity is on: krbd maps with
    read_from_replica=localize there (mappers/read_affinity.py); the others ignore it, as ceph-csi's do."""
    exclusive: bool = False
    """A single-node volume: no other client may write the image while this node maps it
    read-write (mappers/exclusive.py decides whether and how the mapper enforces it)."""


class Mapper(Protocol):
    name: str

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        """A private directory for this mapping, or '' when the mapper needs none."""
        ...

    def map(self, request: MapRequest) -> str: ...

    def find(self, record: StageRecord) -> str | None: ...

    def unmap(self, record: StageRecord) -> None: ...
