"""cephcsi.volumes names no librbd or librados exception: which failure means "gone" or "busy"
is the Ceph layer's decision (cephcsi.ceph.image_access, cephcsi.ceph.errors), not the
journal steps'. See docs/ARCHITECTURE.md, "cephcsi.volumes also holds librbd images". The
import-linter contract in pyproject.toml forbids importing rbd or rados there at all; this
check stays as a second guard that names the offending line."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import rados
import rbd

import cephcsi.volumes

pytestmark = pytest.mark.unit

MODULES = {"rbd": rbd, "rados": rados}


def _exception_names(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in MODULES:
            value = getattr(MODULES[node.value.id], node.attr, None)
            if isinstance(value, type) and issubclass(value, BaseException):
                found.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_volumes_name_no_ceph_exception() -> None:
    package = Path(cephcsi.volumes.__file__).parent
    found = [hit for path in sorted(package.glob("*.py")) for hit in _exception_names(path)]
    assert found == []


def test_the_check_sees_an_exception_name(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import rbd\ntry:\n    pass\nexcept rbd.ImageNotFound:\n    pass\nx = rbd.Image\n")
    assert _exception_names(sample) == ["sample.py:4: rbd.ImageNotFound"]
