"""Seed the test control plane with N bound claims (PVC + PV + attached VolumeAttachment each) and
50 Nodes (+ their CSINodes), fast: plain JSON over one keep-alive pool from many threads (the
generated client's model objects cost more CPU than the apiserver's write), status written through
the status subresource with a merge patch, as kube-controller-manager and the attacher leave it."""
from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import urllib3

from bench import scale_model as m

THREADS = 8
"""Threads per seeding process."""
PROCESSES = 4
"""Seeding processes: one Python process spends about as much CPU per request as the apiserver's
write, so a single one (GIL) would be the bottleneck."""


class ApiError(RuntimeError):
    pass


class RawApi:
    """JSON requests to one apiserver with a bearer token (no client-side rate limit)."""

    def __init__(self, url: str, token: str, ca_file: str, threads: int = THREADS) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.pool = urllib3.PoolManager(maxsize=threads, cert_reqs="CERT_REQUIRED", ca_certs=ca_file,
                                        retries=urllib3.Retry(total=5, connect=5, read=2, status=0, backoff_factor=0.1))
        self.requests = 0
        self._lock = threading.Lock()

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             ok: tuple[int, ...] = (200, 201)) -> dict[str, Any]:
        headers = dict(self.headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        reply = self.pool.request(method, self.url + path, body=data, headers=headers, timeout=60.0)
        with self._lock:
            self.requests += 1
        if reply.status not in ok:
            raise ApiError(f"{method} {path}: {reply.status} {reply.data[:300]!r}")
        return json.loads(reply.data) if reply.data else {}

    def create(self, path: str, body: Any) -> dict[str, Any]:
        return self.call("POST", path, body, ok=(200, 201, 409))

    def status(self, path: str, body: Any) -> dict[str, Any]:
        return self.call("PATCH", path + "/status", body, content_type="application/merge-patch+json")

    def close(self) -> None:
        self.pool.clear()


@dataclass
class Seeded:
    claims: int
    seconds: float
    requests: int
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"claims": self.claims, "seconds": self.seconds, "requests": self.requests,
                "objects_per_s": 3 * self.claims / self.seconds if self.seconds else None,
                "errors": self.errors[:10], "error_count": len(self.errors)}


def seed_nodes(api: RawApi) -> None:
    for i in range(m.NODES):
        api.create("/api/v1/nodes", m.node_body(i))
        api.create("/apis/storage.k8s.io/v1/csinodes", m.csinode_body(i))


def _claim(api: RawApi, seed: m.Seed, i: int) -> None:
    ns = seed.namespace
    claim = api.create(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", m.pvc_body(seed, i))
    uid = (claim.get("metadata") or {}).get("uid")
    if not uid:  # 409: made by an earlier, interrupted seeding
        uid = api.call("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{m.claim_name(i)}")["metadata"]["uid"]
    api.create("/api/v1/persistentvolumes", m.pv_body(seed, i, uid))
    api.create("/apis/storage.k8s.io/v1/volumeattachments", m.attachment_body(seed, i))
    api.status(f"/api/v1/persistentvolumes/{m.pv_name(i)}", m.pv_status())
    api.status(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{m.claim_name(i)}", m.pvc_status())
    api.status(f"/apis/storage.k8s.io/v1/volumeattachments/{m.attachment_name(i)}", m.attachment_status())


def seed_claims(api: RawApi, seed: m.Seed, first: int, count: int, threads: int = THREADS,
                progress: Callable[[int], None] | None = None) -> Seeded:
    """Claims first..first+count−1 (idempotent: an object that exists is left as it is)."""
    errors: list[str] = []
    done = [0]
    lock = threading.Lock()
    before = api.requests

    def one(i: int) -> None:
        try:
            _claim(api, seed, i)
        except Exception as error:  # noqa: BLE001 - counted and reported
            with lock:
                errors.append(f"{m.claim_name(i)}: {type(error).__name__}: {str(error)[:200]}")
        with lock:
            done[0] += 1
            if progress is not None and done[0] % 1000 == 0:
                progress(done[0])

    began = time.monotonic()
    with ThreadPoolExecutor(threads, thread_name_prefix="bench-seed") as pool:
        list(pool.map(one, range(first, first + count)))
    return Seeded(claims=count, seconds=time.monotonic() - began, requests=api.requests - before, errors=errors)


def _seed_part(url: str, token: str, ca_file: str, seed: m.Seed, first: int, count: int) -> tuple[int, list[str]]:
    """One seeding process's share (spawned: a fresh interpreter, nothing inherited)."""
    api = RawApi(url, token, ca_file)
    try:
        done = seed_claims(api, seed, first, count)
    finally:
        api.close()
    return done.requests, done.errors


def seed_claims_parallel(url: str, token: str, ca_file: str, seed: m.Seed, count: int,
                         processes: int = PROCESSES) -> Seeded:
    """Claims 0..count−1 from `processes` spawned processes, each a contiguous share on THREADS threads."""
    from concurrent.futures import ProcessPoolExecutor

    processes = max(1, min(processes, count // 50 or 1))
    share = -(-count // processes)
    parts = [(first, min(share, count - first)) for first in range(0, count, share)]
    began = time.monotonic()
    with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_seed_part, url, token, ca_file, seed, first, n) for first, n in parts]
        results = [f.result() for f in futures]
    return Seeded(claims=count, seconds=time.monotonic() - began, requests=sum(r for r, _ in results),
                  errors=[e for _, errors in results for e in errors])
