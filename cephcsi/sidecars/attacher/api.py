"""The attacher's own API calls beyond KubeApi's: its finalizer on VolumeAttachments, the
attach/detach errors in their status, and the live Node read that decides fencing."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cephcsi.sidecars.api import KubeApi
from cephcsi.sidecars.objects import KubeObject

def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class AttacherApi(KubeApi):
    def add_attachment_finalizer(self, name: str, finalizer: str) -> None:
        self._call(f'add finalizer to VolumeAttachment "{name}"',
                   lambda: self._storage.patch_volume_attachment(
                       name, {"metadata": {"finalizers": [finalizer]}}, _preload_content=False))

    def save_attach_error(self, name: str, message: str) -> None:
        """external-attacher's saveAttachError: status.attachError {time, message}."""
        self._status(name, "attachError", message)

    def save_detach_error(self, name: str, message: str) -> None:
        self._status(name, "detachError", message)

    def _status(self, name: str, field: str, message: str) -> None:
        status: dict[str, Any] = {field: {"time": _now(), "message": message}}
        self._optional(f'save {field} of VolumeAttachment "{name}"',
                       lambda: self._storage.patch_volume_attachment_status(
                           name, {"status": status}, _preload_content=False))

    def get_node(self, name: str) -> KubeObject | None:
        return self._optional(f'get Node "{name}"', lambda: self._core.read_node(name, _preload_content=False))
