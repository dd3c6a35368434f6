"""Memory and CPU of a process from /proc (Linux): VmRSS, VmHWM, utime+stime, threads."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessSample:
    pid: int
    rss_bytes: int
    """VmRSS: resident memory now."""
    hwm_bytes: int
    """VmHWM: peak resident memory since the process started."""
    cpu_s: float
    """utime + stime of all threads so far (children not included)."""
    threads: int
    at: float
    """time.monotonic() of the sample."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_status(text: str) -> dict[str, int]:
    """VmRSS/VmHWM/VmSize in bytes and Threads from /proc/<pid>/status text."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if key in ("VmRSS", "VmHWM", "VmSize", "VmPeak") and len(parts) == 2 and parts[1] == "kB":
            out[key] = int(parts[0]) * 1024
        elif key == "Threads" and parts:
            out[key] = int(parts[0])
    return out


def parse_cpu_seconds(stat_text: str, ticks_per_second: int = CLOCK_TICKS) -> float:
    """utime+stime (fields 14 and 15) from /proc/<pid>/stat text, in seconds.

    The command name (field 2) is in parentheses and may itself hold spaces or ')', so the
    fields are counted from the last ')'."""
    rest = stat_text[stat_text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): utime is field 14 → rest[11], stime field 15 → rest[12].
    utime, stime = int(rest[11]), int(rest[12])
    return (utime + stime) / ticks_per_second


def sample(pid: int) -> ProcessSample:
    """Read the process's memory and CPU now; OSError (ProcessLookupError) if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            status = parse_status(handle.read())
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            cpu = parse_cpu_seconds(handle.read())
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    return ProcessSample(
        pid=pid,
        rss_bytes=status.get("VmRSS", 0),
        hwm_bytes=status.get("VmHWM", 0),
        cpu_s=cpu,
        threads=status.get("Threads", 0),
        at=time.monotonic(),
    )


def process_clock(pid: int) -> int:
    """The Linux CPU-time clock id of another process (MAKE_PROCESS_CPUCLOCK(pid, SCHED)):
    user+system time of all its threads, exited ones included, in nanoseconds."""
    return ((~pid) << 3) | 2


def cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` so far, to the nanosecond (the /proc tick counts are 10 ms
    steps: too coarse for a per-round figure of a few ms per op); /proc when the clock is refused."""
    try:
        return time.clock_gettime(process_clock(pid))
    except OSError:
        return sample(pid).cpu_s


def self_cpu_seconds() -> float:
    """CPU time (user+system, all threads) of this process so far, to the nanosecond."""
    return time.process_time()


def peak(samples: list[ProcessSample]) -> ProcessSample:
    """The largest VmRSS / VmHWM / thread count seen over `samples` (cpu/at of the last one)."""
    if not samples:
        raise ValueError("no samples")
    last = samples[-1]
    return ProcessSample(pid=last.pid, rss_bytes=max(s.rss_bytes for s in samples),
                         hwm_bytes=max(s.hwm_bytes for s in samples), cpu_s=last.cpu_s,
                         threads=max(s.threads for s in samples), at=last.at)


class Sampler:
    """Samples one process every `interval` seconds on a daemon thread between start() and
    stop() (a process that exits just ends the sampling). One /proc read costs ~0.1 ms."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        import threading

        self.pid = pid
        self.interval = interval
        self.samples: list[ProcessSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{pid}", daemon=True)

    def _run(self) -> None:
        while True:
            try:
                self.samples.append(sample(self.pid))
            except ProcessLookupError:
                return
            if self._stop.wait(self.interval):
                return

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> ProcessSample:
        """Stop, take a last sample, and return the peak over the run."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.samples.append(sample(self.pid))
        except ProcessLookupError:
            pass
        return peak(self.samples)
