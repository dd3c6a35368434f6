"""scripts/test.sh's sessions, as its dry run prints them: each reports its slowest tests (so a CI
log shows where the time goes), and every test a release session leaves out still exists (a
rename would otherwise run a minute-long search in a session meant to skip it, or hide a typo)."""
from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ("reef", "tentacle", "tentacle-legacy")


def sessions(**env: str) -> list[list[str]]:
    out = subprocess.run([str(ROOT / "scripts" / "test.sh")], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "CEPHCSI_TEST_DRY_RUN": "1", **env}).stdout
    return [block.splitlines() for block in out.split("\n\n") if block.strip()]


def test_every_session_reports_its_slowest_tests() -> None:
    found = sessions()
    assert len(found) == 1 + len(RELEASES)
    assert found[0] == [".venv/bin/python", "-m", "pytest", "--durations=25"]
    for release, argv in zip(RELEASES, found[1:]):
        assert "--durations=25" in argv, argv
        assert f"--ceph-release={release}" in argv, argv


def test_main_and_releases_are_chosen_by_the_environment() -> None:
    assert sessions(CEPHCSI_TEST_MAIN="0", CEPHCSI_TEST_RELEASES="reef") == sessions()[1:2]
    assert sessions(CEPHCSI_TEST_RELEASES="") == sessions()[:1]


def test_every_deselected_test_exists() -> None:
    deselected = [argv[i + 1] for argv in sessions() for i, arg in enumerate(argv) if arg == "--deselect"]
    assert deselected
    for node in deselected:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        if name:
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            functions = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
            assert name in functions, node
