"""The Kubernetes side of sections 4a/4b: a real etcd + kube-apiserver + kube-controller-manager
(tests/controlplane), the Ceph Secret, real `cephcsi --mode=controller` processes with their
embedded provisioner/attacher and leader election, and watches that timestamp what happens.

Timestamps are `time.monotonic()` in the bench process: taken just before a create/delete call,
and when a watch event arrives (the apiserver pushes it as soon as the object is written, so the
lag is a few ms on loopback, the same for every path measured).

The controllers are started as the e2e tests start them (tests/integration/sidecars/harness.py),
but with production defaults: only --kubeconfig, --leader-election-namespace, an HTTP endpoint
(for /metrics) and --log-level=info are set.
"""
from __future__ import annotations

import functools
import json
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kubernetes.client
from kubernetes.watch.watch import iter_resp_lines

from bench.environment import DRIVER_ARGS, Environment
from bench.kubestats import (
    Burst,
    Lease,
    Predicate,
    Timeline,
    burst,
    claim_of_volume,
    deleted,
    exists,
    has_annotation,
    object_name,
    parse_lease,
    parse_metrics,
    phase_is,
    problem_lines,
)
from bench.raw import RawRbd
from tests.controlplane.cluster import ControlPlane, start_control_plane
from tests.integration.sidecars.harness import KCM_CONTROLLERS, LEASE, ControllerProcess, Kube

log = logging.getLogger("bench")

SECRET = ("bench-secrets", "csi-rbd-secret")
ANN_STORAGE_PROVISIONER = ("volume.kubernetes.io/storage-provisioner", "volume.beta.kubernetes.io/storage-provisioner")
"""kcm sets these on a claim whose class names an external provisioner; only then may it act."""
CREATE_THREADS = 8
"""Threads creating (or deleting) the objects of a burst, as the e2e burst test does."""


def size_text(size_bytes: int) -> str:
    return f"{max(1, size_bytes >> 20)}Mi"


@dataclass
class KubeSetup:
    """The control plane (+ kcm's volume controllers) and an admin view of it, shared by 4a/4b."""

    plane: ControlPlane
    admin: kubernetes.client.ApiClient
    kube: Kube
    config_file: str
    processes: list[ControllerProcess] = field(default_factory=list)

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return self.kube.core

    def namespace(self, prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.kube.ensure_namespace(name)
        return name

    def start_controllers(self, env: Environment, n: int, lease_namespace: str,
                          extra: Iterable[str] = ()) -> list[ControllerProcess]:
        """n `cephcsi --mode=controller` replicas with the embedded loops and default timings."""
        started = []
        for _ in range(n):
            process = ControllerProcess(self.config_file, mode="controller", args=[
                *DRIVER_ARGS, f"--kubeconfig={self.plane.kubeconfig}",
                f"--leader-election-namespace={lease_namespace}", *extra,
            ], workdir=tempfile.mkdtemp(prefix="k-", dir=env.workdir))
            self.processes.append(process)
            started.append(process)
        for process in started:
            process.start(timeout=60)
        return started

    def lease(self, namespace: str) -> Lease:
        try:
            reply = kubernetes.client.CoordinationV1Api(self.admin).read_namespaced_lease(
                LEASE, namespace, _preload_content=False, _request_timeout=(2, 2))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return parse_lease(None)
            raise
        return parse_lease(json.loads(reply.data))

    def stop_controllers(self) -> None:
        for process in self.processes:
            try:
                process.stop()
            except Exception as error:  # noqa: BLE001 - keep stopping
                log.warning("stopping a controller failed: %s", error)
        self.processes.clear()

    def close(self) -> None:
        self.stop_controllers()
        try:
            self.kube.delete_storage_classes()
        except Exception:  # noqa: BLE001 - the plane goes away anyway
            pass
        self.admin.close()
        self.plane.stop()


def start_kube(config_file: str, ceph: Any) -> KubeSetup:
    plane = start_control_plane()
    try:
        plane.start_controller_manager(KCM_CONTROLLERS)
        admin = plane.api_client()
        kube = Kube(admin)
        kube.create_ceph_secret(SECRET[0], SECRET[1], ceph)
    except BaseException:
        plane.stop()
        raise
    return KubeSetup(plane, admin, kube, config_file)


# ---- watches ---------------------------------------------------------------------------------------

class Watch:
    """Watch one kind from now on, on a daemon thread, feeding a Timeline.

    `list_call` is a generated list method (e.g. CoreV1Api.list_namespaced_persistent_volume_claim
    with its positional args bound). The watch starts at the resourceVersion of a list taken in
    start(), so nothing written after start() returns can be missed even if the connection is
    slow to open; it reconnects from the last version it saw (relisting after 410 Gone)."""

    def __init__(self, list_call: Callable[..., Any], key: Callable[[Mapping[str, Any]], str | None],
                 states: Mapping[str, Predicate],
                 on_event: Callable[[str, Mapping[str, Any]], None] | None = None) -> None:
        self.list_call = list_call
        self.on_event = on_event
        """Called on the watch thread with every event after the Timeline saw it (keep it short)."""
        self.timeline = Timeline(key, states)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._rv = ""
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)
        self.errors: list[str] = []

    def _list(self) -> None:
        reply = self.list_call(_preload_content=False, _request_timeout=(5, 30))
        doc = json.loads(reply.data)
        now = time.monotonic()
        with self._cond:
            for obj in doc.get("items") or []:
                self.timeline.record("ADDED", obj, now)
            self._rv = doc["metadata"]["resourceVersion"]
            self._cond.notify_all()

    def start(self) -> Watch:
        self._list()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._response = self.list_call(watch=True, resource_version=self._rv, timeout_seconds=30,
                                                 allow_watch_bookmarks=True, _preload_content=False,
                                                 _request_timeout=(5, 45))
                for line in iter_resp_lines(self._response):
                    now = time.monotonic()
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        self.errors.append(str(obj.get("message") or obj)[:200])
                        self._list()  # 410 Gone or similar: start over from a fresh list
                        break
                    with self._cond:
                        self._rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv
                        if event.get("type") != "BOOKMARK":
                            self.timeline.record(event["type"], obj, now)
                        self._cond.notify_all()
                    if self.on_event is not None and event.get("type") != "BOOKMARK":
                        self.on_event(event["type"], obj)
                    if self._stop.is_set():
                        break
            except Exception as error:  # noqa: BLE001 - a dropped watch reconnects
                if self._stop.is_set():
                    return
                self.errors.append(f"{type(error).__name__}: {str(error)[:150]}")
                time.sleep(0.2)
            finally:
                if self._response is not None:
                    self._response.release_conn()
                    self._response = None

    def wait(self, state: str, names: Iterable[str], timeout: float) -> list[str]:
        """Block until every name reached `state`; the names still missing at the timeout."""
        wanted = list(names)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                missing = self.timeline.missing(state, wanted)
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._cond.wait(min(left, 0.5))

    def first(self, state: str) -> dict[str, float]:
        with self._cond:
            return dict(self.timeline.first[state])

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.close()  # unblocks the reading thread
            except Exception:  # noqa: BLE001
                pass
        self._thread.join(timeout=5)


# ---- bursts of API calls -------------------------------------------------------------------------

def timed_calls(call: Callable[[str], object], names: list[str], threads: int = CREATE_THREADS,
                ) -> tuple[dict[str, float], list[str], float]:
    """call(name) for every name on `threads` threads: ({name: monotonic time just before its
    call}, error messages, wall seconds of all calls)."""
    started: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        at = time.monotonic()
        try:
            call(name)
        except Exception as error:  # noqa: BLE001 - counted, not fatal
            with lock:
                errors.append(f"{name}: {type(error).__name__}: {str(error)[:200]}")
            return
        with lock:
            started[name] = at

    began = time.monotonic()
    with ThreadPoolExecutor(threads, thread_name_prefix="bench-kube") as pool:
        list(pool.map(one, names))
    return started, errors, time.monotonic() - began


def metrics(process: ControllerProcess) -> list[tuple[str, dict[str, str], float]]:
    status, text = process.http("/metrics")
    return parse_metrics(text) if status == 200 else []


def wait_until(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> float | None:
    """Seconds until check() is truthy (polled), None at the timeout."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            return None
        time.sleep(interval)
    return time.monotonic() - began


def log_problems(process: ControllerProcess) -> list[str]:
    """The controller's WARNING/ERROR/CRITICAL log lines so far."""
    return problem_lines(process.log())


# ---- claims of one namespace ------------------------------------------------------------------------

def controller_defaults() -> Any:
    """The controller's sidecar settings when no flag is given (QPS/burst, workers, lease timings)."""
    from cephcsi.cli.args import parse_settings

    return parse_settings(["--mode=controller"]).sidecars


class Claims:
    """Watches on the claims of one namespace ("annotated" by kcm for an external provisioner,
    "bound", "deleted") and on the PVs bound to them ("created", "deleted"; keyed by claim name)."""

    def __init__(self, setup: KubeSetup, namespace: str,
                 on_claim: Callable[[str, Mapping[str, Any]], None] | None = None) -> None:
        core = setup.core
        self.namespace = namespace
        self.pvcs = Watch(functools.partial(core.list_namespaced_persistent_volume_claim, namespace),
                          object_name(namespace), {"annotated": has_annotation(*ANN_STORAGE_PROVISIONER),
                                                   "bound": phase_is("Bound"), "deleted": deleted},
                          on_event=on_claim).start()
        self.pvs = Watch(core.list_persistent_volume, claim_of_volume(namespace),
                         {"created": exists, "deleted": deleted}).start()

    def stop(self) -> None:
        self.pvcs.stop()
        self.pvs.stop()


def images_with(raw: RawRbd, prefix: str) -> list[str]:
    return [i for i in raw.images() if i.startswith(prefix)]


@dataclass
class Deletion:
    """Claims deleted at once: per-claim PV gone, and when the last image / the trash went."""

    pv_gone: Burst | None
    pvs_left: list[str]
    images_gone_s: float | None
    """From the first delete call until no image with the prefix is listed (None: timeout)."""
    images_left: list[str]
    trash_empty_s: float | None
    """From the first delete call until the mgr purged the trash (None: timeout)."""
    errors: list[str]

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in self.__dict__.items() if k != "pv_gone"},
                "pv_gone": self.pv_gone.to_json() if self.pv_gone else None}


def delete_claims(setup: KubeSetup, claims: Claims, names: list[str], raw: RawRbd, prefix: str,
                  timeout: float) -> Deletion:
    """Delete the claims at once (8 threads) and follow PVs, images and the trash (0.1 s polls)."""
    began = time.monotonic()
    result: dict[str, Any] = {}

    def delete_all() -> None:
        result["calls"] = timed_calls(lambda n: setup.kube.delete_pvc(claims.namespace, n), names)

    deleter = threading.Thread(target=delete_all, name="bench-delete", daemon=True)
    deleter.start()
    images_at = trash_at = None
    deadline = began + timeout
    while time.monotonic() < deadline:
        if images_at is None and not images_with(raw, prefix):
            images_at = time.monotonic() - began
        if images_at is not None and trash_at is None and not raw.trash_count():
            trash_at = time.monotonic() - began
        if images_at is not None and trash_at is not None and not deleter.is_alive() \
                and not claims.pvs.timeline.missing("deleted", names):
            break
        time.sleep(0.1)
    deleter.join(timeout=60)
    started, errors, _ = result.get("calls", ({}, ["delete calls did not finish"], 0.0))
    return Deletion(
        pv_gone=burst(started, claims.pvs.first("deleted")) if started else None,
        pvs_left=claims.pvs.timeline.missing("deleted", names),
        images_gone_s=images_at, images_left=images_with(raw, prefix), trash_empty_s=trash_at, errors=errors)


def event_writes(setup: KubeSetup, namespace: str, names: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
    """Events about the named objects of `namespace` (all when None), by "component/reason":
    {"objects": events, "writes": sum of their counts} — a repeated event is one POST and then a
    PATCH per repeat (count + 1), so the count sum is the number of writes its source made."""
    wanted = set(names) if names is not None else None
    reply = setup.core.list_namespaced_event(namespace, _preload_content=False, _request_timeout=(5, 30))
    out: dict[str, dict[str, int]] = {}
    for event in json.loads(reply.data).get("items") or []:
        if wanted is not None and (event.get("involvedObject") or {}).get("name") not in wanted:
            continue
        source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or "?"
        entry = out.setdefault(f"{source}/{event.get('reason')}", {"objects": 0, "writes": 0})
        entry["objects"] += 1
        entry["writes"] += int(event.get("count") or 1)
    return out
