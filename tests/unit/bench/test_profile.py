"""The reader of py-spy's collapsed stacks (`--profile`): self/total per function, shares."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import profile
from bench.cli import build_parser, options_from

pytestmark = pytest.mark.unit

STACKS = """\
_bootstrap (threading.py:1002);run (threading.py:982);wrapper (cephcsi/csi/rpc.py:61);redacted (cephcsi/observability/redact.py:48) 3
_bootstrap (threading.py:1002);run (threading.py:982);wrapper (cephcsi/csi/rpc.py:64);create (cephcsi/ceph/images.py:88) 5
_bootstrap (threading.py:1002);run (threading.py:982);wrapper (cephcsi/csi/rpc.py:64);create (cephcsi/ceph/images.py:90) 2
not a stack line
"""


def test_parse_collapsed_and_frame_keys() -> None:
    stacks = profile.parse_collapsed(STACKS.splitlines())
    assert [count for _, count in stacks] == [3, 5, 2]
    assert profile.frame_key("create (cephcsi/ceph/images.py:88)") == "create (images.py)"
    assert profile.frame_key("<module>") == "<module>"


def test_top_counts_self_and_total_once_per_stack() -> None:
    stacks = profile.parse_collapsed(STACKS.splitlines())
    samples, rows = profile.top(stacks, "self")
    assert samples == 10
    assert (rows[0].frame, rows[0].self_samples, rows[0].total_samples) == ("create (images.py)", 7, 7)
    _, by_total = profile.top(stacks, "total")
    wrapper = next(r for r in by_total if r.frame == "wrapper (rpc.py)")
    assert (wrapper.self_samples, wrapper.total_samples) == (0, 10)
    assert profile.share_under(stacks, "redact.py") == pytest.approx(0.3)
    assert profile.share_under([], "x") == 0.0


def test_report_text_and_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.txt"
    path.write_text(STACKS)
    text = profile.report_text(path)
    assert text.startswith("10 samples") and "70.0%  create (images.py)" in text
    assert profile.main([str(path), "3"]) == 0 and "by self" in capsys.readouterr().out
    assert profile.main([]) == 2


def test_profile_flag() -> None:
    assert options_from(build_parser().parse_args([])).profile == ""
    assert options_from(build_parser().parse_args(["--profile"])).profile == "running"
    assert options_from(build_parser().parse_args(["--profile", "gil"])).profile == "gil"
