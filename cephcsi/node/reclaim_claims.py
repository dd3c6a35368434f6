"""Where the node pass (cephcsi.node.reclaim_loop) reads the leader's record of a volume's last
reclaim-space run: the claim's `reclaimspace.cephcsi.ceph.io/last-run` annotation.

PV name from the volume's publish paths, then `get` of the PV and of its claim (no list or
watch); the PV's answer is cached per volume id. docs/design/node.md, "Finding the claim".
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cephcsi.node import mounts, stage_record
from cephcsi.observability.logging import fields
from cephcsi.volumes.reclaim import LAST_RUN_ANNOTATION, parse_time

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger(__name__)

_PUBLISH = re.compile(r"/pods/[^/]+/volumes/kubernetes\.io~csi/([^/]+)/mount$")


def pv_names(record: stage_record.StageRecord, table: Iterable[mounts.MountEntry]) -> set[str]:
    """PV names in the publish paths of the staged volume (mounts of its staging filesystem)."""
    entries = list(table)
    staging = os.path.realpath(record.mount_path)
    source = [e for e in entries if os.path.realpath(e.mount_point) == staging]
    if not source:
        return set()
    device = (source[-1].major, source[-1].minor)
    names = set()
    for entry in entries:
        if (entry.major, entry.minor) != device:
            continue
        found = _PUBLISH.search(entry.mount_point)
        if found:
            names.add(found.group(1))
    return names


@dataclass(frozen=True)
class ClaimRef:
    """The claim a PV is bound to, as its claimRef names it."""

    pv_name: str
    namespace: str
    name: str
    uid: str = ""


class KubeTrimRequests:
    """cephcsi.node.reclaim_loop.Requests through the Kubernetes API (connected on first use)."""

    def __init__(self, kubeconfig: str = "", timeout: float = 10.0) -> None:
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        self._api: CoreV1Api | None = None
        self.claims: dict[str, ClaimRef] = {}
        """Volume id → its PV's claim, for the volumes staged at the last pass."""

    def _client(self) -> CoreV1Api:
        if self._api is None:
            from kubernetes import client, config

            configuration = client.Configuration()
            if self.kubeconfig:
                config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
            else:
                config.load_incluster_config(client_configuration=configuration)
            self._api = client.CoreV1Api(client.ApiClient(configuration))
        return self._api

    def __call__(self, records: list[stage_record.StageRecord]) -> dict[str, datetime]:
        table = mounts.read_mounts()
        staged = {record.volume_id for record in records}
        for volume_id in [v for v in self.claims if v not in staged]:
            del self.claims[volume_id]
        result: dict[str, datetime] = {}
        for record in records:
            for pv_name in sorted(pv_names(record, table)):
                try:
                    moment = self._last_run(record.volume_id, pv_name)
                except Exception as error:  # noqa: BLE001 - API/config failures: the next pass retries
                    log.warning("cannot read the claim of a staged volume; not trimmed this pass",
                                extra=fields(volume_id=record.volume_id, pv=pv_name, error=str(error)))
                    continue
                if moment is not None:
                    result[record.volume_id] = moment
                    break
        return result

    def _last_run(self, volume_id: str, pv_name: str) -> datetime | None:
        ref = self.claims.get(volume_id)
        if ref is None or ref.pv_name != pv_name:
            ref = self._claim_of(volume_id, pv_name)
            if ref is None:
                return None
            self.claims[volume_id] = ref
        try:
            claim: Any = self._client().read_namespaced_persistent_volume_claim(ref.name, ref.namespace,
                                                                                _request_timeout=self.timeout)
        except Exception as error:
            if getattr(error, "status", None) == 404:
                self.claims.pop(volume_id, None)  # the PV may be bound anew: read it next pass
            raise
        if ref.uid and str(claim.metadata.uid or "") != ref.uid:
            self.claims.pop(volume_id, None)  # another claim under the PV's claim's name: not ours
            return None
        annotations = dict(claim.metadata.annotations or {})
        return parse_time(str(annotations.get(LAST_RUN_ANNOTATION, "")))

    def _claim_of(self, volume_id: str, pv_name: str) -> ClaimRef | None:
        """The claim PV `pv_name` is bound to, when it is the PV of volume `volume_id`."""
        pv: Any = self._client().read_persistent_volume(pv_name, _request_timeout=self.timeout)
        csi = pv.spec.csi if pv.spec is not None else None
        ref = pv.spec.claim_ref if pv.spec is not None else None
        if csi is None or csi.volume_handle != volume_id or ref is None or not ref.name:
            return None
        return ClaimRef(pv_name, str(ref.namespace or ""), str(ref.name), str(ref.uid or ""))
