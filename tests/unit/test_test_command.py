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
                         env={**outside_settings(), "CEPHCSI_TEST_DRY_RUN": "1", **env}).stdout
    return [block.splitlines() for block in out.split("\n\n") if block.strip()]


def outside_settings() -> dict[str, str]:
    """The environment without the test command's own settings: this test may run inside a
    session started with some of them (e.g. CEPHCSI_TEST_RELEASES="")."""
    return {key: value for key, value in os.environ.items() if not key.startswith("CEPHCSI_TEST_")}


def test_every_session_reports_its_slowest_tests() -> None:
    found = sessions()
    assert len(found) == 2 + len(RELEASES)
    assert found[0] == [".venv/bin/python", "-m", "pytest", "--durations=25", "-m", "not long and (e2e or not vm)"]
    assert found[1] == [".venv/bin/python", "-m", "pytest", "--durations=25", "-m", "vm and not e2e and not long",
                        "tests/vm"]
    for release, argv in zip(RELEASES, found[2:]):
        assert argv[argv.index("--durations=25") + 1:][:2] == ["-m", "not long"], argv
        assert f"--ceph-release={release}" in argv, argv


def test_main_and_vm_split_the_pacific_suite_between_them() -> None:
    """Every test of the VM modules in the ci tier runs in exactly one of the main session and
    the vm lane (collected over the modules that carry the vm marker, to stay fast)."""
    main, vm = (selected(argv) for argv in sessions(CEPHCSI_TEST_RELEASES="")[:2])
    assert main and vm and not main & vm
    assert all(node.startswith("tests/vm/") for node in vm)
    assert not any(node.startswith(("tests/e2e/test_vm_node.py", "tests/e2e/test_vm_node_loss.py"))
                   for node in main)  # the long tier's
    assert any(node.startswith("tests/vm/test_harness.py") for node in main)
    assert main | vm == selected([".venv/bin/python", "-m", "pytest", "-m", "not long"])


VM_MODULES = ["tests/vm", "tests/e2e/test_vm_node.py", "tests/e2e/test_vm_node_loss.py"]


def selected(argv: list[str]) -> set[str]:
    options = [arg for arg in argv[argv.index("pytest") + 1:] if not arg.startswith("tests/")]
    out = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "pytest", *options, *VM_MODULES,
                          "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    return {line for line in out.splitlines() if "::" in line}


def test_main_and_releases_are_chosen_by_the_environment() -> None:
    assert sessions(CEPHCSI_TEST_MAIN="0", CEPHCSI_TEST_RELEASES="reef") == sessions()[2:3]
    assert sessions(CEPHCSI_TEST_RELEASES="") == sessions()[:2]


def test_the_long_tier_runs_only_the_long_tests_once_and_all_runs_everything() -> None:
    assert sessions(CEPHCSI_TEST_TIER="long") == [[".venv/bin/python", "-m", "pytest", "--durations=25", "-m", "long"]]
    everything = sessions(CEPHCSI_TEST_TIER="all")
    assert len(everything) == 2 + len(RELEASES)
    assert everything[0][-2:] == ["-m", "e2e or not vm"] and everything[1][-3:] == ["-m", "vm and not e2e", "tests/vm"]
    assert all("-m" not in argv[argv.index("--durations=25"):] for argv in everything[2:]), everything


def test_an_unknown_tier_is_refused() -> None:
    run = subprocess.run([str(ROOT / "scripts" / "test.sh")], capture_output=True, text=True, timeout=60,
                         env={**outside_settings(), "CEPHCSI_TEST_DRY_RUN": "1", "CEPHCSI_TEST_TIER": "quick"})
    assert run.returncode == 2 and "ci, long or all" in run.stderr


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
