"""Section 4a's floors: claims bound with no driver (kcm and the apiserver alone) and the bare
Ceph creates, each measured in the same run as the burst it is compared with."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench import kubestats, procstat
from bench.kube import Claims, KubeSetup, controller_defaults, event_writes, timed_calls
from bench.load import run_batch
from bench.raw import RawRbd

RAW_THREADS = 8


ZERO_COST_PROVISIONER = "bench.invalid/zero-cost"
ANN_PROVISIONER = "volume.kubernetes.io/storage-provisioner"


def bound_pv(name: str, namespace: str, claim: str, uid: str, size: str, storage_class: str) -> dict[str, Any]:
    """A PV bound to the claim (claimRef with its uid), as a provisioner writes it: kcm's PV sync
    then queues the claim at once (a claimRef without uid would wait for the claim's resync)."""
    return {"metadata": {"name": name}, "spec": {
        "capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": storage_class,
        "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": namespace, "name": claim,
                     "uid": uid},
        "csi": {"driver": "bench.invalid", "volumeHandle": name}}}


class KubeFloors:
    """Claims bound with no Ceph and no driver, through a client with the controller's QPS/burst.

    - zero-cost provisioner: a StorageClass naming a provisioner nobody runs; the bench writes the
      PV (bound to the claim) the moment kcm has annotated the claim for that provisioner — the
      real protocol (kcm annotates, events, binds) with a provisioner that costs nothing;
    - PVC + PV by hand: claims with no class, each followed at once by its PV — the apiserver
      writes alone (wall of the 2N creates) and kcm's binder alone (→ all Bound)."""

    def __init__(self, setup: KubeSetup, size: str) -> None:
        import kubernetes.client

        from cephcsi.kube.client import ClientSettings, new_api_client

        defaults = controller_defaults()
        self.setup = setup
        self.size = size
        self.qps, self.burst = defaults.kube_api_qps, defaults.kube_api_burst
        self.namespace = setup.namespace("bench-floor")
        self.tag = uuid.uuid4().hex[:6]
        self.storage_class = f"bench-zero-{self.tag}"
        setup.kube.storage.create_storage_class({"metadata": {"name": self.storage_class},
                                                 "provisioner": ZERO_COST_PROVISIONER})
        self.client = new_api_client(ClientSettings(kubeconfig=str(setup.plane.kubeconfig), qps=self.qps,
                                                    burst=self.burst))
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.pool = ThreadPoolExecutor(8, thread_name_prefix="bench-zero")
        self.answered: set[str] = set()
        self.errors: list[str] = []
        self.claims = Claims(setup, self.namespace, on_claim=self._on_claim)

    def _pv_name(self, claim: str) -> str:
        return f"bench-{self.tag}-{claim}"

    def _on_claim(self, event_type: str, claim: Mapping[str, Any]) -> None:
        meta = claim.get("metadata") or {}
        name = str(meta.get("name") or "")
        if event_type == "DELETED" or name in self.answered:
            return
        if (meta.get("annotations") or {}).get(ANN_PROVISIONER) == ZERO_COST_PROVISIONER:
            self.answered.add(name)
            self.pool.submit(self._create_pv, name, meta["uid"], self.storage_class)

    def _create_pv(self, claim: str, uid: str, storage_class: str) -> None:
        try:
            self.core.create_persistent_volume(
                bound_pv(self._pv_name(claim), self.namespace, claim, uid, self.size, storage_class),
                _preload_content=False)
        except Exception as error:  # noqa: BLE001 - reported
            self.errors.append(f"{claim}: {type(error).__name__}: {str(error)[:200]}")

    def _claim(self, name: str, storage_class: str) -> str:
        reply = self.core.create_namespaced_persistent_volume_claim(self.namespace, {
            "metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                                                 "resources": {"requests": {"storage": self.size}}}},
            _preload_content=False)
        return str(json.loads(reply.data)["metadata"]["uid"])

    def zero_cost_claim(self, name: str) -> None:
        self._claim(name, self.storage_class)

    def claim_and_pv(self, name: str) -> None:
        self._create_pv(name, self._claim(name, ""), "")

    def run(self, n: int, repeats: int) -> dict[str, Any]:
        claims = self.claims
        out: dict[str, Any] = {"qps": self.qps, "burst": self.burst}
        everything: list[str] = []
        # Zero-cost provisioner: one claim at a time, then a burst.
        single: dict[str, float] = {}
        for i in range(repeats):
            name = f"zero-one-{i}"
            single[name] = time.monotonic()
            self.zero_cost_claim(name)
            claims.pvcs.wait("bound", [name], 60)
        everything += list(single)
        out["zero_single"] = kubestats.burst(single, claims.pvcs.first("bound"))
        time.sleep(2)  # let the buckets refill (this client's, and kcm's QPS 20 / burst 30)
        names = [f"zero-{i:03d}" for i in range(n)]
        started, errors, _ = timed_calls(self.zero_cost_claim, names)
        everything += names
        out["zero_missing"] = claims.pvcs.wait("bound", names, max(120.0, 3.0 * n))
        out["zero_burst"] = kubestats.burst(started, claims.pvcs.first("bound"))
        out["zero_stages"] = stages(claims, started)
        out["zero_events"] = event_writes(self.setup, self.namespace, names)
        time.sleep(2)
        # PVC + PV by hand, no class: apiserver writes and kcm's binder alone.
        names = [f"byhand-{i:03d}" for i in range(n)]
        started, errors2, wall = timed_calls(self.claim_and_pv, names)
        everything += names
        out["byhand_create_wall_s"] = wall
        out["byhand_missing"] = claims.pvcs.wait("bound", names, max(120.0, 3.0 * n))
        out["byhand_burst"] = kubestats.burst(started, claims.pvcs.first("bound"))
        out["errors"] = errors + errors2 + self.errors
        # Clean up: claims, then their PVs (Retain: nothing in Ceph).
        timed_calls(lambda c: self.setup.kube.delete_pvc(self.namespace, c), everything)
        claims.pvcs.wait("deleted", everything, 120)
        timed_calls(lambda c: self.setup.kube.delete_pv(self._pv_name(c)), everything)
        out["pvs_left"] = claims.pvs.wait("deleted", everything, 120)
        return out

    def close(self) -> None:
        self.claims.stop()
        self.pool.shutdown(wait=True)
        self.client.close()
        try:
            self.setup.kube.storage.delete_storage_class(self.storage_class)
        except Exception:  # noqa: BLE001 - the plane goes away anyway
            pass


def kube_floor(setup: KubeSetup, n: int, repeats: int, size: str) -> dict[str, Any]:
    floors = KubeFloors(setup, size)
    try:
        return floors.run(n, repeats)
    finally:
        floors.close()


def stages(claims: Claims, started: Mapping[str, float]) -> list[kubestats.Stage]:
    """create → annotated by kcm → PV created → Bound, per claim."""
    return kubestats.stages(started, [("create → annotated", claims.pvcs.first("annotated")),
                                      ("annotated → PV created", claims.pvs.first("created")),
                                      ("PV created → Bound", claims.pvcs.first("bound"))])


def raw_floor(raw: RawRbd, n: int) -> dict[str, Any]:
    s0 = procstat.self_cpu_seconds()
    created = run_batch(raw.create, [raw.new_name() for _ in range(n)], RAW_THREADS)
    cpu = procstat.self_cpu_seconds() - s0
    run_batch(raw.remove, created.results, RAW_THREADS)  # untimed clean-up
    return {"batch": created, "cpu_s": cpu}
