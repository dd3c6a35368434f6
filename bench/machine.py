"""What machine a run came from, recorded with every result file."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _run(*argv: str, timeout: float = 20) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def meminfo_total(text: str) -> int:
    """MemTotal in bytes from /proc/meminfo text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_model(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return ""


def os_name(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip().strip('"')
    return ""


def loadavg() -> str:
    return " ".join(_read("/proc/loadavg").split()[:3])


def cpu_jiffies(text: str) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat text: busy = total − idle − iowait."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:]]
            total = sum(values[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
            idle = values[3] + (values[4] if len(values) > 4 else 0)
            return total - idle, total
    return 0, 0


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """Share of all CPUs' time that was busy between two cpu_jiffies() readings."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else None


def cpu_now() -> tuple[int, int]:
    return cpu_jiffies(_read("/proc/stat"))


def collect() -> dict[str, Any]:
    commit = _run("git", "rev-parse", "--short=12", "HEAD")
    dirty = _run("git", "status", "--porcelain", "--untracked-files=no", "--", "cephcsi")
    total = meminfo_total(_read("/proc/meminfo"))
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 0
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "os": os_name(_read("/etc/os-release")),
        "kernel": platform.release(),
        "cpu_model": cpu_model(_read("/proc/cpuinfo")),
        "nproc": usable,
        "memory_total": f"{total / (1 << 30):.1f} GiB",
        "memory_total_bytes": total,
        "ceph_version": _run("ceph", "--version"),
        "python_version": platform.python_version(),
        "cephcsi_commit": commit + ("+dirty" if dirty else ""),
        "loadavg_start": loadavg(),
    }
