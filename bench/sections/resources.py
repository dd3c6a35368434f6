"""Section 3a: memory and CPU of the cephcsi processes, read from /proc (VmRSS = resident now,
VmHWM = peak resident since start, CPU = utime+stime of all threads)."""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from bench import report
from bench.environment import Environment
from bench.model import SectionResult, Table
from bench import procstat
from bench.procstat import ProcessSample
from bench.sections import node_ops
from bench.sections.base import Section

NAME = "resources"
TITLE = "3a. Memory and CPU of the cephcsi processes"


def _rows(table: Table, process: str, samples: dict[str, ProcessSample]) -> None:
    for label, s in samples.items():
        table.add(process, label, report.mib(s.rss_bytes), report.mib(s.hwm_bytes), report.num(s.cpu_s, 2), s.threads)


FLOOR_IMPORTS = "import grpc, rados, rbd, cephcsi._generated.csi_pb2_grpc"
# What the embedded sidecars will load on top (the kubernetes client pulls in every API model).
KUBE_IMPORTS = "import cephcsi.kube.client, cephcsi.kube.informer, cephcsi.kube.leaderelection"


def interpreter_floor(imports: str = FLOOR_IMPORTS) -> ProcessSample:
    """RSS of an idle interpreter that has only imported what any cephcsi process must load
    (gRPC, the rados/rbd bindings with librados/librbd, the CSI stubs): the memory floor.
    RuntimeError when the imports fail."""
    code = f"{imports}; import sys; sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        if child.stdout.readline() != b"ready\n":
            raise RuntimeError(f"{imports!r} failed")
        time.sleep(0.5)
        return procstat.sample(child.pid)
    finally:
        child.kill()
        child.wait(timeout=10)


def run(env: Environment) -> SectionResult:
    result = SectionResult(name=NAME, title=TITLE)
    if len(env.controller_samples) < 2:
        env.controller()
        env.sample_controller("idle (no create/delete batches ran in this run)")
    table = Table(columns=["process", "state", "VmRSS MiB", "VmHWM MiB", "CPU s (cumulative)", "threads"])
    floor = interpreter_floor()
    table.add("floor", f"python3.11 + {FLOOR_IMPORTS[7:]} imported, idle", report.mib(floor.rss_bytes),
              report.mib(floor.hwm_bytes), report.num(floor.cpu_s, 2), floor.threads)
    data_kube: dict[str, Any] | None = None
    try:
        kube = interpreter_floor(f"{FLOOR_IMPORTS}; {KUBE_IMPORTS}")
    except RuntimeError:
        pass
    else:
        table.add("floor+kube", "the floor + cephcsi.kube (kubernetes client) imported, idle", report.mib(kube.rss_bytes),
                  report.mib(kube.hwm_bytes), report.num(kube.cpu_s, 2), kube.threads)
        data_kube = kube.to_json()
        result.notes.append(
            f"floor+kube − floor = {report.mib(kube.rss_bytes - floor.rss_bytes)} MiB: the least the embedded "
            "sidecars will add to the controller (importing the kubernetes Python client loads every API model)")
    _rows(table, "controller", env.controller_samples)

    data: dict[str, Any] = {"floor": floor.to_json(), "floor_kube": data_kube,
                            "controller": {k: v.to_json() for k, v in env.controller_samples.items()}}
    before = env.controller_samples.get("after warm-up (connected, idle)")
    after = env.controller_samples.get("after the create/delete batches (idle)")
    levels = env.shared.get("controller_levels", [])
    ops = env.shared.get("controller_rpcs") or sum(
        (lvl["driver_create"] or {}).get("count", 0) + (lvl["driver_delete"] or {}).get("count", 0) for lvl in levels)
    if before and after and ops:
        cpu = after.cpu_s - before.cpu_s
        data["controller_batches"] = {"cpu_s": cpu, "ops": ops, "cpu_ms_per_op": cpu * 1000 / ops}
        result.notes.append(f"controller CPU during the create/delete batches: {cpu:.2f} s for {ops} RPCs "
                            f"= {cpu * 1000 / ops:.2f} ms per RPC (server side, all threads)")

    reason = node_ops.unavailable_reason()
    if reason:
        table.add("node plugin", f"skipped: {reason}", "—", "—", "—", "—")
    else:
        try:
            env.node()
        except Exception as error:  # noqa: BLE001 - report, do not crash the run
            table.add("node plugin", f"skipped: did not start ({str(error)[:80]})", "—", "—", "—", "—")
        else:
            _rows(table, "node plugin", env.node_samples)
            data["node"] = {k: v.to_json() for k, v in env.node_samples.items()}
    result.tables = [table]
    result.data = data
    return result


SECTION = Section(NAME, TITLE, run)
