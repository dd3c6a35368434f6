"""Section 1's gRPC side is called from Go (bench/grpccaller), as a cluster's callers call it.

A CSI controller's external callers are Go programs (csi-provisioner, csi-sanity). Calling it from
Python threads in the bench process would put a Python gRPC client on the same two cores as the
driver, the OSD and the raw side: 0.26–0.5 ms of client CPU per call that no real caller pays,
charged to the driver's throughput. The Go program makes a whole batch at a given concurrency
and reports its own CPU, which the section prints beside the driver's.

The binary is built on first use with the Go toolchain (modules from the proxy) and cached outside
the repository, keyed by its sources, so an edit rebuilds it.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.load import Batch, TimedBatch

SOURCE = Path(__file__).resolve().parent / "grpccaller"
SOURCES = ("main.go", "go.mod", "go.sum")
BUILD_TIMEOUT_S = 600.0
EXIT_TIMEOUT_S = 60.0


class CallerError(RuntimeError):
    """The Go caller could not be built, or failed outside the calls it times."""


def _cache_root() -> Path:
    base = os.environ.get("CEPHCSI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cephcsi")
    return Path(base) / "bench"


def source_key() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build() -> Path:
    """The caller binary for the current sources: cached, or built now."""
    binary = _cache_root() / f"grpccaller-{source_key()}" / "grpccaller"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod -buildvcs=false", "CGO_ENABLED": "0"}
    done = subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), "."],
                          cwd=SOURCE, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise CallerError(f"building bench/grpccaller failed: {done.stderr.strip()[-2000:]}")
    partial.rename(binary)  # a killed build never leaves a half-written binary under the final name
    return binary


class GoCaller:
    """Batches of CreateVolume / DeleteVolume on a controller's unix socket, from the Go caller."""

    def __init__(self, endpoint: str, parameters: Mapping[str, str], secrets: Mapping[str, str],
                 capacity_bytes: int, timeout_s: float, server_clock: Callable[[], float]) -> None:
        self.binary = build()
        self.server_clock = server_clock
        self.endpoint = endpoint
        self.parameters = dict(parameters)
        self.secrets = dict(secrets)
        self.capacity_bytes = capacity_bytes
        self.timeout_s = timeout_s

    def create(self, names: Sequence[str], concurrency: int) -> TimedBatch:
        return self._run("create", names, concurrency)

    def delete(self, volume_ids: Sequence[str], concurrency: int) -> TimedBatch:
        return self._run("delete", volume_ids, concurrency)

    def _run(self, op: str, items: Sequence[str], concurrency: int) -> TimedBatch:
        request = {"endpoint": self.endpoint, "op": op, "concurrency": concurrency, "timeout_s": self.timeout_s,
                   "items": list(items), "capacity_bytes": self.capacity_bytes, "parameters": self.parameters,
                   "secrets": self.secrets}
        # The secrets go over stdin, never on the command line.
        with subprocess.Popen([str(self.binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as process:
            assert process.stdin is not None and process.stdout is not None and process.stderr is not None
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            # Connected and probed before the clock starts: the connection is not the calls' cost.
            if process.stdout.readline().strip() != "ready":
                process.kill()
                raise CallerError(f"grpccaller did not connect: {process.stderr.read().strip()[-2000:]}")
            server0 = self.server_clock()
            process.stdin.write("go\n")
            process.stdin.flush()
            answer = process.stdout.readline()
            server1 = self.server_clock()
            errors = process.stderr.read()
            if process.wait(timeout=EXIT_TIMEOUT_S) != 0 or not answer:
                raise CallerError(f"grpccaller failed: {errors.strip()[-2000:]}")
        return parse_answer(json.loads(answer), concurrency, server1 - server0)


def parse_answer(answer: Mapping[str, Any], concurrency: int, server_cpu_s: float) -> TimedBatch:
    batch: Batch[str] = Batch(latencies=[float(v) for v in answer["latencies_s"]],
                              results=[str(v) for v in answer["results"]],
                              errors=[str(e)[:300] for e in answer["errors"]],
                              wall_s=float(answer["wall_s"]), concurrency=concurrency)
    return TimedBatch(batch=batch, driver_cpu_s=server_cpu_s, caller_cpu_s=float(answer["cpu_s"]))
