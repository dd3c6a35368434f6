"""The servicers one process serves, as the CLI wires them and the sidecars call them in-process.

Defined here, beside the servicers, so the sidecars (the layer above) can name the contract
without importing the CLI that builds it (the layer above them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cephcsi.csi.controller import ControllerServicer
from cephcsi.csi.identity import IdentityServicer
from cephcsi.csi.server import CSIServer

if TYPE_CHECKING:
    # Only the node mode imports the node servicer (and the node modules it loads).
    from cephcsi.csi.node import NodeServicer


@dataclass
class Services:
    """What the sidecars may call in-process (None when this mode does not serve it)."""

    identity: IdentityServicer
    controller: ControllerServicer | None
    node: NodeServicer | None
    servers: list[CSIServer]
