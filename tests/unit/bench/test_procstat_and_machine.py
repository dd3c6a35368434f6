"""Parsing /proc files and the build script's output (pure functions of text)."""
from __future__ import annotations

import pytest

from bench import machine, procstat
from bench.sections.go_sidecars import parse_build_output

pytestmark = pytest.mark.unit

STATUS = """Name:\tpython
State:\tS (sleeping)
VmPeak:\t  900000 kB
VmSize:\t  800000 kB
VmHWM:\t   70000 kB
VmRSS:\t   61440 kB
Threads:\t31
"""


def test_parse_status() -> None:
    values = procstat.parse_status(STATUS)
    assert values["VmRSS"] == 61440 * 1024
    assert values["VmHWM"] == 70000 * 1024
    assert values["Threads"] == 31


def test_parse_cpu_seconds_survives_odd_command_names() -> None:
    # Fields after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    tail = "S 1 2 3 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 9 0"
    assert procstat.parse_cpu_seconds(f"1234 (python) {tail}", ticks_per_second=100) == pytest.approx(4.0)
    assert procstat.parse_cpu_seconds(f"1234 (a ) b (c)) {tail}", ticks_per_second=100) == pytest.approx(4.0)


def test_sample_of_this_process_and_of_a_missing_one() -> None:
    import os

    s = procstat.sample(os.getpid())
    assert s.rss_bytes > 0 and s.hwm_bytes >= s.rss_bytes and s.threads >= 1 and s.cpu_s > 0
    with pytest.raises(ProcessLookupError):
        procstat.sample(2**22 + 12345)


def test_machine_text_parsers() -> None:
    assert machine.meminfo_total("MemFree: 1 kB\nMemTotal:       24684032 kB\n") == 24684032 * 1024
    assert machine.meminfo_total("") == 0
    assert machine.cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n") == "AMD EPYC 7B13"
    assert machine.os_name('NAME="Debian"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n') == "Debian GNU/Linux 12 (bookworm)"


def test_parse_build_output() -> None:
    text = (
        "csi-attacher v4.13.0 /root/.cache/cephcsi/sidecars/csi-attacher-v4.13.0/csi-attacher\n"
        "livenessprobe - FAILED latest: 403 Forbidden\n"
        "garbage\n"
    )
    built = parse_build_output(text)
    assert [(b.name, b.version, bool(b.path)) for b in built] == [
        ("csi-attacher", "v4.13.0", True), ("livenessprobe", "-", False)]
    assert built[1].error == "latest: 403 Forbidden"


def test_peak_over_samples() -> None:
    def s(rss: int, hwm: int, cpu: float, threads: int) -> procstat.ProcessSample:
        return procstat.ProcessSample(pid=1, rss_bytes=rss, hwm_bytes=hwm, cpu_s=cpu, threads=threads, at=cpu)

    peak = procstat.peak([s(10, 10, 1.0, 5), s(30, 30, 2.0, 9), s(20, 30, 3.0, 7)])
    assert (peak.rss_bytes, peak.hwm_bytes, peak.cpu_s, peak.threads) == (30, 30, 3.0, 9)
    with pytest.raises(ValueError):
        procstat.peak([])


def test_sampler_of_this_process() -> None:
    import os
    import time

    sampler = procstat.Sampler(os.getpid(), interval=0.01).start()
    time.sleep(0.05)
    peak = sampler.stop()
    assert len(sampler.samples) >= 2 and peak.rss_bytes > 0 and peak.pid == os.getpid()


def test_cpu_seconds_of_a_process_is_precise_and_moves() -> None:
    import os
    import time

    from bench import procstat

    pid = os.getpid()
    before = procstat.cpu_seconds(pid)
    deadline = time.process_time() + 0.02
    while time.process_time() < deadline:
        pass
    after = procstat.cpu_seconds(pid)
    assert 0.015 <= after - before < 1.0
    assert abs(procstat.cpu_seconds(pid) - procstat.self_cpu_seconds()) < 0.05


def test_osd_op_counters_parse_and_subtract() -> None:
    from bench.osdops import OpCounts, parse_perf_dump

    before = parse_perf_dump('{"osd": {"op": 10, "op_r": 4, "op_w": 3, "op_rw": 3, "op_wip": 0}}')
    after = parse_perf_dump('{"osd": {"op": 110, "op_r": 44, "op_w": 23, "op_rw": 43}}')
    delta = after.minus(before)
    assert delta == OpCounts(100, 40, 20, 40)
    assert delta.per(10) == {"op": 10.0, "op_r": 4.0, "op_w": 2.0, "op_rw": 4.0}
    assert delta.per(0) == {}
