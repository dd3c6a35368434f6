"""Section 2c's pure parts: first-vs-last comparison, the /proc and sysfs scans, the verdicts."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import build_parser, options_from
from bench.load import Batch
from bench.procstat import ProcessSample
from bench.sections import node_scale_figures, node_scale_report
from bench.sections.node_scale_figures import Figures, Reading, ends, loops_under, per_volume, rbd_fuse_daemons

pytestmark = pytest.mark.unit


def test_ends_compares_the_first_k_with_the_last_k_and_never_overlaps() -> None:
    samples = [0.10, 0.12, 0.11] + [0.5] * 20 + [0.11, 0.13, 0.12]
    got = ends(samples, k=3)
    assert got is not None and got.k == 3
    assert (got.first.median, got.first.high, got.last.median) == (0.11, 0.12, 0.12)
    assert got.ratio == pytest.approx(0.12 / 0.11)
    assert got.as_fast and "within the first's upper quartile" in got.verdict()
    short = ends([1.0, 2.0, 3.0], k=10)  # k shrinks to half: one each end
    assert short is not None and (short.k, short.first.median, short.last.median) == (1, 1.0, 3.0)
    assert not short.as_fast and "above" in short.verdict() and short.verdict().startswith("3.00×")
    assert ends([1.0]) is None and ends([]) is None
    # One stalled call among the first does not make a slower end pass (the maximum would).
    outlier = ends([0.1] * 9 + [0.6] + [0.3] * 10)
    assert outlier is not None and not outlier.as_fast


def test_per_volume_growth() -> None:
    assert per_volume(100.0, 300.0, 100) == 2.0
    assert per_volume(1.0, 2.0, 0) is None


def _process(proc: Path, pid: int, *argv: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def test_rbd_fuse_daemons_are_those_serving_a_path_under_the_root(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "root"
    root.mkdir()
    work = root / "state/fuse/abc"
    _process(proc, 11, "rbd-fuse", "-c", str(work / "ceph.conf"), "--id", "u", "-r", "img", str(work / "mnt"))
    _process(proc, 12, "/usr/bin/rbd-fuse", "-c", "/elsewhere/ceph.conf", "/elsewhere/mnt")
    _process(proc, 13, "python3", str(work / "mnt"))
    _process(proc, 14, "rbd-fuse", "-c", str(tmp_path / "rootless/ceph.conf"), str(tmp_path / "rootless/mnt"))
    (proc / "self").mkdir()
    (proc / "15").mkdir()  # exited meanwhile: no cmdline
    assert rbd_fuse_daemons(str(root), proc=str(proc)) == {11: str(work / "mnt")}
    assert rbd_fuse_daemons(str(root), proc=str(tmp_path / "missing")) == {}


def test_loops_under_reads_the_backing_files_from_sysfs(tmp_path: Path) -> None:
    sys_block = tmp_path / "block"
    for name, backing in (("loop0", "/r/state/fuse/a/mnt/img (deleted)"), ("loop1", "/other/file"),
                          ("loop2", None), ("sda", "/r/state/x")):
        (sys_block / name / "loop").mkdir(parents=True)
        if backing is not None:
            (sys_block / name / "loop" / "backing_file").write_text(backing + "\n")
    assert loops_under("/r", sys_block=str(sys_block)) == ["/dev/loop0"]
    assert loops_under("/r/sta", sys_block=str(sys_block)) == []


def test_the_volume_count_flag() -> None:
    def options(*argv: str) -> int:
        return node_scale_figures.volume_count(options_from(build_parser().parse_args(list(argv))))

    assert (options(), options("--quick"), options("--quick", "--node-volumes", "40")) == (100, 10, 40)
    with pytest.raises(SystemExit):
        options("--node-volumes", "0")


def _reading(label: str, rss_mib: int, threads: int) -> Reading:
    return Reading(label, ProcessSample(pid=1, rss_bytes=rss_mib << 20, hwm_bytes=rss_mib << 20, cpu_s=0.0,
                                        threads=threads, at=0.0), fds=10)


def _figures(restart_s: float, survived: str, last_stage_s: float, stats_wall_s: float,
             leftovers: dict[str, list[str]]) -> Figures:
    f = Figures(volumes=20, first_start_s=2.0, restart_s=restart_s)
    f.stage = [0.10] * 10 + [last_stage_s] * 10
    f.publish = [0.002] * 20
    f.unpublish, f.unstage = [0.002] * 20, [0.02] * 20
    f.readings = [_reading("started", 70, 10), _reading("20 staged", 72, 10)]
    f.checks = {"plugin CPU per stage+publish, ms": "20.0", "staging and target still mounted": "20/20",
                "rbd-fuse daemon survived (same pid)": survived}
    f.stats = {"all staged, c=1": Batch(latencies=[0.01] * 20, results=[True] * 20, wall_s=stats_wall_s)}
    f.leftovers = leftovers
    return f


def _verdicts(f: Figures) -> list[str]:
    return [row[-1] for row in node_scale_report._goals(f).rows if not row[-1].startswith("informational")]


def test_goal_verdicts_follow_the_figures() -> None:
    assert _verdicts(_figures(3.0, "20/20", 0.10, 1.0, {})) == ["met", "met", "met", "reported", "met"]
    slow_restart = _verdicts(_figures(10.5, "20/20", 0.10, 1.0, {}))
    lost_daemon = _verdicts(_figures(3.0, "19/20", 0.10, 1.0, {}))
    slower = _verdicts(_figures(3.0, "20/20", 0.2, 61.0, {"mounts": ["/x"]}))
    assert slow_restart[1] == lost_daemon[1] == "NOT met"
    assert slower[0] == slower[2] == slower[4] == "NOT met"


def test_tables_render_with_the_per_volume_growth() -> None:
    f = _figures(3.0, "20/20", 0.10, 1.0, {})
    f.manual_empty.stage, f.manual_empty.publish = [0.08], [0.002]
    process = node_scale_report._process_table(f)
    assert process.rows[-1][:3] == ["per staged volume (staged − started) / N", "102.4 KiB", "—"]
    latency, data = node_scale_report._latency_table(f)
    assert latency.rows[0][0] == "stage+publish" and latency.rows[0][6] == "1.24×"  # 0.102 / 0.082
    assert data["stage"]["as_fast"] is True
    assert data["plugin cpu per stage+publish"] is None  # no CPU readings: no row figures, no crash
    f.stage_cpu = [0.02] * 10 + [0.05] * 10
    latency, data = node_scale_report._latency_table(f)
    cpu_row = next(r for r in latency.rows if r[0].strip().startswith("the plugin's CPU"))
    assert cpu_row[1:4] == ["20.0 (20.0–20.0)", "50.0 (50.0–50.0)", "2.50×, above the first's upper quartile"]
    f.manual_full.stage, f.manual_full.publish = [0.16], [0.004]
    floor_row = [r for r in node_scale_report._goals(f).rows if r[-1].startswith("informational")]
    assert floor_row and floor_row[0][1] == "1.24× → 0.62× the floor (the floor itself 2.00×)"
