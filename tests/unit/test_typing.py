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


# 3.11: development machines and the test cluster (bookworm, [tool.mypy] python_version);
# 3.14: the image (sid, whose Tentacle bindings exist only for it). typeshed marks what a
# Python version removed or added, so the second run catches stdlib use that breaks on one of
# the two. mypy keeps one cache per target version: the second costs its own first run once.
@pytest.mark.parametrize("python_version", ["3.11", "3.14"])
def test_mypy_strict_passes(python_version: str) -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                          "--python-version", python_version],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
