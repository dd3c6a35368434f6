"""The PersistentVolumes of this driver that point into the audited pool (read-only).

A PV's volume handle encodes the cluster id, pool id and journal uuid (cephcsi.volumes.
volume_id); a handle that does not decode (a statically provisioned PV) still protects the
image its `imageName` attribute names.
"""
from __future__ import annotations

from typing import Any

from kubernetes import client as k8s

from cephcsi.audit.kube_lists import PAGE, api_client, list_all
from cephcsi.audit.model import PVView
from cephcsi.volumes.volume_id import MalformedId, VolumeId


def pv_view(pv: Any, driver_name: str, cluster_id: str, pool_id: int, pool: str) -> PVView | None:
    """The PV reduced to what names an image of this pool, or None if it names none."""
    csi = pv.spec.csi if pv.spec else None
    if csi is None or csi.driver != driver_name:
        return None
    attributes = csi.volume_attributes or {}
    phase = pv.status.phase if pv.status else ""
    try:
        volume_id = VolumeId.decode(csi.volume_handle or "")
    except MalformedId:
        if attributes.get("pool") == pool and attributes.get("imageName"):
            return PVView(pv.metadata.name, "", attributes["imageName"], phase or "")
        return None
    if volume_id.cluster_id != cluster_id or volume_id.pool_id != pool_id:
        return None
    return PVView(pv.metadata.name, volume_id.object_uuid, attributes.get("imageName", ""), phase or "")


def list_pvs(kubeconfig: str, driver_name: str, cluster_id: str, pool_id: int, pool: str) -> tuple[PVView, ...]:
    """Every PV of `driver_name` naming an image of (cluster, pool), read page by page."""
    with api_client(kubeconfig) as client:
        api = k8s.CoreV1Api(client)

        def page(token: str | None) -> tuple[list[Any], str | None]:
            listing = api.list_persistent_volume(limit=PAGE, _continue=token)
            return listing.items, listing.metadata._continue if listing.metadata else None

        views = (pv_view(pv, driver_name, cluster_id, pool_id, pool) for pv in list_all(page, "list PersistentVolumes"))
        return tuple(view for view in views if view is not None)
