"""`mypy --strict` over the package, bench/ and tests/ (configuration: [tool.mypy] in
pyproject.toml; stubs for Ceph's rados/rbd and the kubernetes client boundary in typings/).

mypy keeps its cache in .mypy_cache/ (git-ignored): the first run in a fresh tree takes about
ten seconds on two cores, later runs re-check only what changed."""
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mypy_strict_passes() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
