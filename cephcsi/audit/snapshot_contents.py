"""The VolumeSnapshotContents of this driver that name a snapshot of the audited pool (read-only),
filtered by the handle's volume-id layout. Design: docs/design/audit.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s

from cephcsi.audit.kube_lists import PAGE, api_client, list_all
from cephcsi.audit.model import ContentView
from cephcsi.kube.errors import ApiNotFound
from cephcsi.volumes.volume_id import MalformedId, VolumeId

# The API the snapshotter sidecar uses (cephcsi.sidecars.snapshotter.api), which the layer
# contract keeps the audit from importing.
GROUP = "snapshot.storage.k8s.io"
VERSION = "v1"
CONTENTS = "volumesnapshotcontents"
REQUEST_PREFIX = "snapshot-"
"""CreateSnapshot is called with 'snapshot-<VolumeSnapshot uid>' (cephcsi.sidecars.snapshotter.content)."""


def _decodes_here(handle: str, cluster_id: str, pool_id: int) -> VolumeId | None:
    try:
        decoded = VolumeId.decode(handle)
    except MalformedId:
        return None  # not an id this driver (or ceph-csi) issues: nothing of this pool
    return decoded if (decoded.cluster_id, decoded.pool_id) == (cluster_id, pool_id) else None


def content_view(content: Mapping[str, Any], driver_name: str, cluster_id: str, pool_id: int) -> ContentView | None:
    """The content reduced to what names a snapshot of this pool, or None if it names none."""
    spec = content.get("spec") or {}
    if spec.get("driver") != driver_name:
        return None
    source = spec.get("source") or {}
    ref = spec.get("volumeSnapshotRef") or {}
    handle = str((content.get("status") or {}).get("snapshotHandle") or source.get("snapshotHandle") or "")
    request_name = f"{REQUEST_PREFIX}{ref['uid']}" if ref.get("uid") and source.get("volumeHandle") else ""
    if handle:
        decoded = _decodes_here(handle, cluster_id, pool_id)
        if decoded is None:
            return None
        uuid = decoded.object_uuid
    elif request_name and _decodes_here(str(source["volumeHandle"]), cluster_id, pool_id):
        uuid = ""
    else:
        return None
    metadata = content.get("metadata") or {}
    bound = f"{ref.get('namespace', '')}/{ref.get('name', '')}" if ref.get("name") else ""
    return ContentView(str(metadata.get("name", "")), uuid, request_name, str(spec.get("deletionPolicy") or ""),
                       bound, bool(metadata.get("deletionTimestamp")))


def list_contents(kubeconfig: str, driver_name: str, cluster_id: str, pool_id: int) -> tuple[ContentView, ...] | None:
    """Every VolumeSnapshotContent of `driver_name` naming a snapshot of (cluster, pool), read
    page by page; None when the API server does not serve them (the snapshot CRDs are not
    installed), so that no content can exist."""
    with api_client(kubeconfig) as client:
        api = k8s.CustomObjectsApi(client)

        def page(token: str | None) -> tuple[list[Any], str | None]:
            listing = api.list_cluster_custom_object(GROUP, VERSION, CONTENTS, limit=PAGE, _continue=token)
            return listing.get("items") or [], (listing.get("metadata") or {}).get("continue")

        try:
            views = [content_view(c, driver_name, cluster_id, pool_id)
                     for c in list_all(page, "list VolumeSnapshotContents")]
        except ApiNotFound:
            return None
        return tuple(view for view in views if view is not None)
