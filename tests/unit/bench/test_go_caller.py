"""bench.go_caller's pure parts: the answer becomes a TimedBatch, and the cache key follows the
sources (the build and the calls are tested against a real controller in
tests/integration/controller/test_bench_go_caller.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import go_caller

pytestmark = pytest.mark.unit


def test_an_answer_becomes_a_timed_batch() -> None:
    answer = {"wall_s": 0.5, "latencies_s": [0.1, 0.2], "results": ["a", "b"], "errors": ["x" * 400],
              "cpu_s": 0.01}
    timed = go_caller.parse_answer(answer, 4, 0.25)
    assert timed.batch.latencies == [0.1, 0.2]
    assert timed.batch.results == ["a", "b"]
    assert timed.batch.errors == ["x" * 300]  # as long as run_batch keeps a message
    assert timed.batch.wall_s == 0.5 and timed.batch.concurrency == 4
    assert timed.driver_cpu_s == 0.25 and timed.caller_cpu_s == 0.01


def test_the_cache_key_follows_every_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in go_caller.SOURCES:
        (tmp_path / name).write_text(f"{name}\n")
    monkeypatch.setattr(go_caller, "SOURCE", tmp_path)
    keys = {go_caller.source_key()}
    for name in go_caller.SOURCES:
        (tmp_path / name).write_text(f"{name} changed\n")
        keys.add(go_caller.source_key())
    assert len(keys) == 1 + len(go_caller.SOURCES)


def test_the_cache_lives_outside_the_repository(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CEPHCSI_CACHE", str(tmp_path))
    assert go_caller._cache_root() == tmp_path / "bench"
