"""docs/ARCHITECTURE.md's "Data flows" names real modules, files and methods: a rename or a move
that the doc does not follow fails here, so a newcomer never follows a path that is gone."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
_CODE = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"^[\w./-]+\.py$|^tests/[\w./-]+/$")
_QUALIFIED = re.compile(r"^([A-Z]\w+)\.(\w+)$")


def _data_flows() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n## Data flows\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _exists(path: str) -> bool:
    if (ROOT / path).exists() or (ROOT / "cephcsi" / path).exists():
        return True
    # A bare or partial name written after its package was named (`claims.py` under the
    # provisioner): some file of the package or the tests must end with it.
    return any(str(found.relative_to(ROOT)).endswith(path)
               for top in ("cephcsi", "tests") for found in ROOT.glob(f"{top}/**/{Path(path).name}"))


def _defined(cls: str, member: str) -> bool:
    pattern = re.compile(rf"^class {cls}\b.*?(?=^class |\Z)", re.S | re.M)
    # The package, and the stubs of the Ceph bindings (librbd's `RBD.create`).
    for source in [*(ROOT / "cephcsi").rglob("*.py"), *(ROOT / "typings").rglob("*.pyi")]:
        for body in pattern.findall(source.read_text(encoding="utf-8")):
            if re.search(rf"^\s+(def {member}\b|{member}\s*[:=])", body, re.M):
                return True
    return False


def test_the_section_is_there_and_names_modules() -> None:
    names = _CODE.findall(_data_flows())
    assert sum(1 for n in names if _PATH.match(n)) > 30, "the Data flows section lost its module names"


def test_every_module_and_file_named_exists() -> None:
    missing = sorted({n for n in _CODE.findall(_data_flows()) if _PATH.match(n) and not _exists(n)})
    assert not missing, f"docs/ARCHITECTURE.md, Data flows, names files that do not exist: {missing}"


def test_every_class_member_named_exists() -> None:
    missing = sorted({n for n in _CODE.findall(_data_flows())
                      if (m := _QUALIFIED.match(n)) and not _defined(m.group(1), m.group(2))})
    assert not missing, f"docs/ARCHITECTURE.md, Data flows, names methods that do not exist: {missing}"


def test_the_checks_catch_a_missing_name() -> None:
    assert not _exists("volumes/no_such_module.py")
    assert not _defined("VolumeManager", "no_such_method")
    assert _defined("VolumeManager", "create") and _exists("claims.py") and _defined("RBD", "create")
