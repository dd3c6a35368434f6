"""What the provisioner's workers share: caches, API, event recorder, the CSI servicers, options."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from cephcsi.kube.events import EventRecorder
from cephcsi.kube.informer import Informer
from cephcsi.sidecars import objects
from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.provisioner.port import ControllerPort
from cephcsi.sidecars.provisioner.pvspec import PVOptions
from cephcsi.sidecars.provisioner.request import RequestOptions
from cephcsi.sidecars.provisioner.topology import TopologyPolicy
from cephcsi.sidecars.snapshotter.api import SnapshotApi


def provisioner_identity(driver_name: str) -> str:
    """external-provisioner's per-process identity: `<ms since epoch>-<0..9999>-<driver>`."""
    return f"{int(time.time() * 1000)}-{random.randint(0, 9999)}-{driver_name}"


@dataclass
class ProvisionerContext:
    driver_name: str
    claims: Informer
    volumes: Informer
    classes: Informer
    attachments: Informer
    api: KubeApi
    events: EventRecorder
    controller: ControllerPort
    calls: CsiCalls
    request_options: RequestOptions
    pv_options: PVOptions
    nodes: Informer | None = None
    """Only with topology."""
    csinodes: Informer | None = None
    """Only with topology."""
    snapshots: SnapshotApi | None = None
    """VolumeSnapshot reads for claims restored from a snapshot (cephcsi.sidecars.provisioner.datasource)."""
    topology_policy: TopologyPolicy = TopologyPolicy()
    """--strict-topology / --immediate-topology (used only with topology)."""

    def storage_class(self, name: str) -> KubeObject | None:
        """The claim's class from the cache, or live when the cache lacks it: a class created just
        before its claim may not have reached the informer yet, and a 'not found' event for a class
        that exists would send a user hunting for a typo."""
        if not name:
            return None
        cached = self.classes.get(name)
        return cached if cached is not None else self.api.get_storage_class(name)

    def claim_by_uid(self, key: str, uid: str) -> KubeObject | None:
        """The cached claim at `key` if it is still the incarnation with `uid`."""
        claim = self.claims.get(key)
        return claim if claim is not None and objects.uid(claim) == uid else None
