"""The architecture in docs/ARCHITECTURE.md, enforced: import-linter checks the layer contracts
declared in pyproject.toml."""
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_import_layers_hold() -> None:
    lint = pathlib.Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
