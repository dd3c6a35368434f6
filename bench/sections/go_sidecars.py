"""Section 3b: RSS of the kubernetes-csi Go sidecars the embedded design replaces, each started
at rest against our controller's socket (and, for those that need one, a real kube-apiserver
from tests/controlplane), beside our controller's RSS.

The binaries come from bench/build_sidecars.sh (Go module proxy, cached in
~/.cache/cephcsi/sidecars/). A sidecar the proxy does not serve is reported as not built.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import procstat, report
from bench.environment import Environment
from bench.model import SectionResult, Table
from bench.sections.base import Section

log = logging.getLogger("bench")

NAME = "sidecars"
TITLE = "3b. Go sidecars (kubernetes-csi) at rest vs the cephcsi controller"
BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "build_sidecars.sh"
NEEDS_KUBE = {"csi-provisioner", "csi-attacher"}
CONTROLLER_SIDE = ("csi-provisioner", "csi-attacher", "livenessprobe")


@dataclass
class Built:
    name: str
    version: str
    path: str = ""
    error: str = ""


@dataclass
class Running:
    built: Built
    popen: subprocess.Popen[bytes]
    log_path: Path
    samples: list[procstat.ProcessSample] = field(default_factory=list)


def parse_build_output(text: str) -> list[Built]:
    """Lines of build_sidecars.sh: `<name> <version> <path>` or `<name> <version> FAILED <reason>`."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        if parts[2] == "FAILED":
            out.append(Built(parts[0], parts[1], error=parts[3] if len(parts) > 3 else "build failed"))
        else:
            out.append(Built(parts[0], parts[1], path=" ".join(parts[2:])))
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _argv(b: Built, csi_socket: str, kubeconfig: str, workdir: Path) -> list[str]:
    common = [b.path, f"--csi-address={csi_socket}", "--v=2"]
    if b.name in NEEDS_KUBE:
        return [*common, f"--kubeconfig={kubeconfig}", "--leader-election=false"]
    if b.name == "livenessprobe":
        return [*common, f"--http-endpoint=127.0.0.1:{_free_port()}"]
    # csi-node-driver-registrar
    reg = workdir / "registry"
    reg.mkdir(exist_ok=True)
    return [*common, f"--kubelet-registration-path={csi_socket}", f"--plugin-registration-path={reg}"]


def _build(env: Environment) -> list[Built]:
    extra = {} if env.options.build else {"ONLY_CACHED": "1"}
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600,
                          env={**os.environ, **extra}, check=False)
    return parse_build_output(done.stdout)


def _start(b: Built, argv: list[str], workdir: Path) -> Running:
    log_path = workdir / f"{b.name}.log"
    with open(log_path, "wb") as handle:
        popen = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    return Running(b, popen, log_path)


def _stop(r: Running) -> None:
    if r.popen.poll() is None:
        r.popen.send_signal(signal.SIGTERM)
        try:
            r.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            r.popen.kill()
            r.popen.wait(timeout=10)


def _start_plane(ok: list[Built]) -> tuple[Any, str]:
    """The control plane, when a sidecar needs one; (plane or None, why it did not start)."""
    if not any(b.name in NEEDS_KUBE for b in ok):
        return None, ""
    try:
        from tests.controlplane.cluster import start_control_plane

        return start_control_plane(), ""
    except Exception as error:  # noqa: BLE001 - measure what needs no apiserver
        kube_error = f"{type(error).__name__}: {str(error)[:200]}"
        log.warning("control plane did not start: %s", kube_error)
        return None, kube_error


def _sample_sidecars(env: Environment, ok: list[Built]) -> tuple[list[Running], str]:
    """Start each built sidecar, let it settle, sample it, stop it; (the runs, control-plane error)."""
    controller = env.controller()
    workdir = env.workdir / "sidecars"
    workdir.mkdir(exist_ok=True)
    plane, kube_error = _start_plane(ok)
    running: list[Running] = []
    try:
        for b in ok:
            if b.name in NEEDS_KUBE and plane is None:
                continue
            # The registrar belongs beside the node plugin; it is started against the controller
            # socket here (it only needs GetPluginInfo).
            kubeconfig = str(plane.kubeconfig) if plane is not None else ""
            running.append(_start(b, _argv(b, controller.socket, kubeconfig, workdir), workdir))
        time.sleep(env.options.sidecar_settle_s)
        for r in running:
            if r.popen.poll() is None:
                r.samples.append(procstat.sample(r.popen.pid))
    finally:
        for r in running:
            _stop(r)
        if plane is not None:
            plane.stop()
    return running, kube_error


@dataclass
class _GoSum:
    rss: int = 0
    hwm: int = 0
    measured: list[str] = field(default_factory=list)


def _sidecar_row(table: Table, b: Built, found: Running | None, kube_error: str, total: _GoSum) -> dict[str, Any]:
    """One sidecar's row (measured, not built, not started or exited); its JSON record."""
    if not b.path:
        table.add(b.name, b.version, "—", "—", "—", "—", f"not built: {b.error[:90]}")
        return {"built": False, "error": b.error}
    if found is None:
        table.add(b.name, b.version, "—", "—", "—", "—", f"pending: needs the control plane ({kube_error[:80]})")
        return {"built": True, "measured": False, "error": kube_error}
    if not found.samples:
        tail = found.log_path.read_text(errors="replace")[-300:].strip().replace("\n", " | ")
        table.add(b.name, b.version, "—", "—", "—", "—", f"exited {found.popen.returncode}: {tail[-90:]}")
        return {"built": True, "measured": False, "exit": found.popen.returncode, "log": tail}
    s = found.samples[-1]
    note = "against our controller socket" + (" + kube-apiserver" if b.name in NEEDS_KUBE else "")
    table.add(b.name, b.version, report.mib(s.rss_bytes), report.mib(s.hwm_bytes), report.num(s.cpu_s, 2),
              s.threads, note)
    if b.name in CONTROLLER_SIDE:
        total.rss += s.rss_bytes
        total.hwm += s.hwm_bytes
        total.measured.append(b.name)
    log_tail = found.log_path.read_text(errors="replace").strip().splitlines()[-6:]
    return {"built": True, "version": b.version, **s.to_json(), "log_tail": log_tail}


def _ours_rows(table: Table, ours: procstat.ProcessSample, total: _GoSum) -> None:
    if total.measured:
        table.add("sum of Go controller-side sidecars", "+".join(total.measured), report.mib(total.rss),
                  report.mib(total.hwm), "", "", "what the embedded loops replace")
    table.add("cephcsi controller", "this tree", report.mib(ours.rss_bytes), report.mib(ours.hwm_bytes),
              report.num(ours.cpu_s, 2), ours.threads, "--sidecars=none (the driver alone)")
    if total.measured:
        table.add("ratio cephcsi / Go sum", "", report.times(ours.rss_bytes / total.rss),
                  report.times(ours.hwm_bytes / total.hwm), "", "", "")


def run(env: Environment) -> SectionResult:
    """Build (cached), start and sample each Go sidecar; tabulate against our controller."""
    result = SectionResult(name=NAME, title=TITLE)
    built = _build(env)
    wanted = [b for b in built if b.name in CONTROLLER_SIDE or b.name == "csi-node-driver-registrar"]
    ok = [b for b in wanted if b.path]
    if not ok:
        result.status, result.reason = "skipped", "no Go sidecar could be built: " + "; ".join(
            f"{b.name}: {b.error}" for b in wanted)
        return result
    running, kube_error = _sample_sidecars(env, ok)
    table = Table(columns=["process", "version", "VmRSS MiB", "VmHWM MiB", "CPU s", "threads", "note"])
    data: dict[str, Any] = {"settle_s": env.options.sidecar_settle_s, "sidecars": {}}
    total = _GoSum()
    for b in wanted:
        found = next((x for x in running if x.built is b), None)
        data["sidecars"][b.name] = _sidecar_row(table, b, found, kube_error, total)
    ours = env.sample_controller("during the sidecars section (idle)")
    _ours_rows(table, ours, total)
    data["controller"] = ours.to_json()
    data["go_controller_side_sum"] = {"rss_bytes": total.rss, "hwm_bytes": total.hwm, "measured": total.measured}
    result.tables = [table]
    result.data = data
    env.shared["go_sidecars"] = data  # 4a compares the whole stacks
    result.notes.append(
        f"Go sidecars sampled after {env.options.sidecar_settle_s:g} s at rest (empty cluster: no PVCs, no "
        "VolumeAttachments); the cephcsi row is the shared --sidecars=none controller (the driver alone). The "
        "whole-stack comparison (one controller with the embedded provisioner+attacher vs driver + Go sidecars) "
        "is in 4a.")
    if kube_error:
        result.notes.append(f"control plane unavailable: {kube_error}")
    return result


SECTION = Section(NAME, TITLE, run)
