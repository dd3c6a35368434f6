"""Builders of API objects (as the informers cache them: plain camelCase dicts) and fakes of the
provisioner's collaborators, for the pure-logic and worker tests."""
from __future__ import annotations

import builtins
import copy
import threading
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from cephcsi._generated import csi_pb2
from cephcsi.errors import CephCSIError, NotFound
from cephcsi.kube.handlers import EventHandler
from cephcsi.sidecars import objects
from cephcsi.sidecars.calls import CsiCalls
from cephcsi.sidecars.provisioner.context import ProvisionerContext
from cephcsi.sidecars.provisioner.pvspec import PVOptions
from cephcsi.sidecars.provisioner.request import RequestOptions

DRIVER = "rbd.csi.ceph.com"
FINALIZER = f"{DRIVER}/provisioning"
FAKE_KEY = "AQAAAAAAAAAAABAAa2tra2tra2tra2tra2traw=="  # well-formed cephx key bytes, not a real key


def claim(name: str = "data", namespace: str = "ns", *, uid: str | None = None, size: str = "1Gi",
          modes: tuple[str, ...] = ("ReadWriteOnce",), storage_class: str = "fast", provisioner: str | None = DRIVER,
          annotations: dict[str, str] | None = None, finalizers: tuple[str, ...] = (), volume_mode: str = "Filesystem",
          deleting: bool = False, **spec: Any) -> dict[str, Any]:
    ann = dict(annotations or {})
    if provisioner:
        ann["volume.kubernetes.io/storage-provisioner"] = provisioner
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or str(uuidlib.uuid4()),
                            "resourceVersion": "42", "annotations": ann, "finalizers": list(finalizers)}
    if deleting:
        meta["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
        "spec": {"accessModes": list(modes), "resources": {"requests": {"storage": size}},
                 "storageClassName": storage_class, "volumeMode": volume_mode, **spec},
        "status": {"phase": "Pending"},
    }


def storage_class(name: str = "fast", *, parameters: dict[str, str] | None = None, provisioner: str = DRIVER,
                  **extra: Any) -> dict[str, Any]:
    params = {"clusterID": "c1", "pool": "rbd",
              "csi.storage.k8s.io/provisioner-secret-name": "ceph", "csi.storage.k8s.io/provisioner-secret-namespace": "sys"}
    if parameters is not None:
        params = parameters
    return {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": provisioner, "parameters": params, **extra}


class FakeInformer:
    def __init__(self, *items: dict[str, Any], indexes: dict[str, Any] | None = None) -> None:
        self.items = {objects.key(i): i for i in items}
        self.indexes = indexes or {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.items.get(key)

    def list(self) -> list[dict[str, Any]]:
        return list(self.items.values())

    def put(self, item: dict[str, Any]) -> None:
        self.items[objects.key(item)] = item

    def remove(self, key: str) -> None:
        self.items.pop(key, None)

    def by_index(self, index: str, value: str) -> builtins.list[dict[str, Any]]:
        func = self.indexes.get(index)
        return [i for i in self.items.values() if func and value in func(i)]

    def add_indexers(self, indexers: dict[str, Any]) -> None:
        self.indexes.update(indexers)


@dataclass
class FakeApi:
    """Records writes; serves live reads from `pvs`/`pvcs`; `secrets` by (namespace, name)."""

    secrets: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    pvs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pvcs: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    classes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """StorageClasses the live read finds but the informer cache does not have yet."""
    calls: list[tuple[str, ...]] = field(default_factory=list)
    fail: dict[str, CephCSIError] = field(default_factory=dict)

    def _record(self, *call: str) -> None:
        self.calls.append(call)
        if call[0] in self.fail:
            raise self.fail[call[0]]

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        self._record("read_secret", namespace, name)
        if (namespace, name) not in self.secrets:
            raise NotFound(f'get secret "{namespace}/{name}": not found')
        return dict(self.secrets[(namespace, name)])

    def get_pv(self, name: str) -> dict[str, Any] | None:
        self._record("get_pv", name)
        return self.pvs.get(name)

    def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._record("get_pvc", namespace, name)
        return self.pvcs.get((namespace, name))

    def get_storage_class(self, name: str) -> dict[str, Any] | None:
        self._record("get_storage_class", name)
        return self.classes.get(name)

    def create_pv(self, body: dict[str, Any]) -> dict[str, Any] | None:
        self._record("create_pv", body["metadata"]["name"])
        if body["metadata"]["name"] in self.pvs:
            return None
        self.pvs[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def delete_pv(self, name: str) -> None:
        self._record("delete_pv", name)

    def add_pv_finalizer(self, name: str, finalizer: str) -> None:
        self._record("add_pv_finalizer", name, finalizer)

    def remove_pv_finalizer(self, name: str, finalizer: str) -> None:
        self._record("remove_pv_finalizer", name, finalizer)

    def add_pvc_finalizer(self, namespace: str, name: str, finalizer: str) -> dict[str, Any]:
        self._record("add_pvc_finalizer", namespace, name, finalizer)
        return {}

    def remove_pvc_finalizer(self, namespace: str, name: str, finalizer: str) -> None:
        self._record("remove_pvc_finalizer", namespace, name, finalizer)

    def remove_pvc_annotation(self, namespace: str, name: str, annotation: str) -> None:
        self._record("remove_pvc_annotation", namespace, name, annotation)

    def mark_attached(self, name: str, metadata: dict[str, str] | None = None) -> None:
        self._record("mark_attached", name)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@dataclass
class FakeEvents:
    recorded: list[tuple[str, str, str, str]] = field(default_factory=list)

    def event(self, obj: Any, event_type: str, reason: str, message: str) -> None:
        self.recorded.append((objects.name(obj), event_type, reason, message))

    def reasons(self) -> list[str]:
        return [r[2] for r in self.recorded]


class FakeVolumes:
    def __init__(self) -> None:
        self.journal: dict[str, str] = {}

    def find(self, name: str, parameters: Any, credentials: Any) -> str | None:
        return self.journal.get(name)


class FakeController:
    """CreateVolume/DeleteVolume against an in-memory journal; `error` makes CreateVolume fail,
    `gate` makes it wait, `on_create` runs inside it."""

    def __init__(self) -> None:
        self.volumes = FakeVolumes()
        self.created: list[csi_pb2.CreateVolumeRequest] = []
        self.deleted: list[str] = []
        self.error: CephCSIError | None = None
        self.gate: threading.Event | None = None
        self.on_create: Any = None

    def CreateVolume(self, request: csi_pb2.CreateVolumeRequest, context: object) -> csi_pb2.CreateVolumeResponse:  # noqa: N802
        self.created.append(request)
        if self.gate is not None:
            self.gate.wait(10)
        if self.on_create is not None:
            self.on_create()
        if self.error is not None:
            raise self.error
        volume_id = self.volumes.journal.setdefault(request.name, f"0001-0002-c1-0000000000000001-{uuidlib.uuid4()}")
        return csi_pb2.CreateVolumeResponse(volume=csi_pb2.Volume(
            volume_id=volume_id, capacity_bytes=request.capacity_range.required_bytes,
            volume_context={"clusterID": "c1", "pool": "rbd", "imageName": "csi-vol-x"}))

    def find_volume(self, name: str, parameters: Any, credentials: Any) -> str | None:
        return self.volumes.find(name, parameters, credentials)

    def DeleteVolume(self, request: csi_pb2.DeleteVolumeRequest, context: object) -> csi_pb2.DeleteVolumeResponse:  # noqa: N802
        self.deleted.append(request.volume_id)
        for name, volume_id in list(self.volumes.journal.items()):
            if volume_id == request.volume_id:
                del self.volumes.journal[name]
        return csi_pb2.DeleteVolumeResponse()


def context(*, claims: FakeInformer | None = None, volumes: FakeInformer | None = None,
            classes: FakeInformer | None = None, attachments: FakeInformer | None = None,
            api: FakeApi | None = None, controller: FakeController | None = None,
            timeout: float = 5.0) -> ProvisionerContext:
    return ProvisionerContext(
        driver_name=DRIVER,
        claims=claims or FakeInformer(),  # type: ignore[arg-type]
        volumes=volumes or FakeInformer(),  # type: ignore[arg-type]
        classes=classes or FakeInformer(storage_class()),  # type: ignore[arg-type]
        attachments=attachments or FakeInformer(),  # type: ignore[arg-type]
        api=api or FakeApi(secrets={("sys", "ceph"): {"userID": "u", "userKey": FAKE_KEY}}),  # type: ignore[arg-type]
        events=FakeEvents(),  # type: ignore[arg-type]
        controller=controller or FakeController(),
        calls=CsiCalls(max_workers=4, timeout=timeout),
        request_options=RequestOptions(DRIVER, "ext4", False, True),
        pv_options=PVOptions(DRIVER, "123-4-" + DRIVER),
    )


class FakeContents(FakeInformer):
    """The contents informer: the cache the apiserver fake writes into, and the update events a
    watch would deliver for those writes (what re-queues a content in the real loop)."""

    def __init__(self, *items: dict[str, Any]) -> None:
        super().__init__(*items)
        self.handlers: list[EventHandler] = []
        self.started = threading.Event()
        self.stopped = False

    def start(self) -> None:
        self.started.set()

    def wait_for_sync(self, timeout: float) -> bool:
        return self.started.wait(timeout)

    def add_handler(self, handler: EventHandler) -> EventHandler:
        self.handlers.append(handler)
        for item in list(self.items.values()):
            if handler.on_add is not None:
                handler.on_add(item)
        return handler

    def remove_handler(self, registration: EventHandler) -> None:
        self.handlers.remove(registration)

    def changed(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        self.put(new)
        for handler in list(self.handlers):
            if handler.on_update is not None:
                handler.on_update(old, new)
