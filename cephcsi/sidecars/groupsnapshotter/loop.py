"""The group snapshotter's leader-only loop: the snapshotter's loop (its own informer, started
once discovery serves VolumeGroupSnapshotContents; one work queue; workers) over the group
contents. Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cephcsi.kube.ratelimit import ItemBackoffSettings
from cephcsi.sidecars.groupsnapshotter.api import GROUP
from cephcsi.sidecars.groupsnapshotter.content import BEING_CREATED, GroupContentWorker, GroupSnapshotterContext
from cephcsi.sidecars.objects import KubeObject
from cephcsi.sidecars.snapshotter.content import only_own_bookkeeping
from cephcsi.sidecars.snapshotter.loop import DISCOVERY_INTERVAL, SnapshotterLoop


class GroupSnapshotterLoop(SnapshotterLoop):
    loop_name = "group snapshotter"
    group = GROUP
    crds = "VolumeGroupSnapshot CRDs"
    crds_hint = "groupsnapshot.storage.k8s.io_*.yaml of kubernetes-csi/external-snapshotter client/config/crd"
    # Optional, as in csi-snapshotter (which runs on without them): said once, not a warning.
    missing_level = logging.INFO

    def __init__(self, ctx: GroupSnapshotterContext, *, workers: int, backoff: ItemBackoffSettings,
                 resync: float = 600.0, discovery_interval: float = DISCOVERY_INTERVAL) -> None:
        super().__init__(ctx, workers=workers, backoff=backoff, resync=resync, discovery_interval=discovery_interval)
        self.group_ctx = ctx

    def _worker(self, stop: threading.Event) -> Callable[[str], None]:
        return GroupContentWorker(self.group_ctx, stop).process

    def _only_own_bookkeeping(self, old: KubeObject, new: KubeObject) -> bool:
        return only_own_bookkeeping(old, new, BEING_CREATED)
