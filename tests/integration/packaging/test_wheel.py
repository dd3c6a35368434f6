"""The wheel a user or the Dockerfile builds, checked from a clean tree.

Editable installs (scripts/setup.sh) hide packaging mistakes: the source tree already has the
generated stubs in cephcsi/_generated/, left there by an earlier build. This test builds the
wheel the way the Dockerfile's builder stage does (`pip wheel`, isolated build environment)
from a copy of the tree *without* any build output, installs it into a fresh venv and runs it.

What "the tree" is: the files git would commit with `git add -A` — tracked files as they are
in the working tree, plus untracked files that are not git-ignored — copied from the working
tree. Not `git archive HEAD`: that would test the last commit, so an uncommitted fix (or an
uncommitted break) would go unseen until after it is committed. Ignored files (the generated
stubs, *.egg-info, build/, __pycache__/) never reach the copy, exactly as in a fresh clone
or in the Dockerfile's build context (.dockerignore drops cephcsi/_generated/ too).

Cost: about 10 s with a warm pip cache (the isolated build environment and the dependencies
come from PyPI or pip's cache).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import cephcsi

pytestmark = [pytest.mark.integration, pytest.mark.packaging, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
GENERATED = (
    "csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py",
    "pluginregistration_pb2.py", "pluginregistration_pb2.pyi", "pluginregistration_pb2_grpc.py",
)


def committable_files(repo: Path) -> list[str]:
    """What `git add -A` would commit: tracked and untracked-but-not-ignored files that exist."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True, timeout=60,
    )
    names = sorted({n for n in proc.stdout.decode().split("\0") if n})
    # A tracked file deleted in the working tree is still listed by --cached: skip it, as
    # the commit would.
    return [n for n in names if (repo / n).is_file() or (repo / n).is_symlink()]


def export_tree(repo: Path, dest: Path) -> None:
    for name in committable_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target, follow_symlinks=False)


def run(argv: list[str], timeout: float = 300, **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc  # type: ignore[no-any-return]


def link_ceph_bindings(venv_python: Path) -> None:
    """Link Debian's rados/rbd modules into the venv, as scripts/setup.sh and the Dockerfile
    do; skipped where the bindings are not installed (the import check below then fails
    with a clear message, which is the point on a machine meant to run cephcsi)."""
    site = run([str(venv_python), "-c", 'import sysconfig; print(sysconfig.get_paths()["platlib"])']).stdout.strip()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for mod in ("rados", "rbd"):
        source = Path("/usr/lib/python3/dist-packages") / f"{mod}{suffix}"
        if source.exists():
            os.symlink(source, Path(site) / source.name)


def test_export_leaves_out_build_output(tmp_path: Path) -> None:
    names = committable_files(REPO)
    assert "setup.py" in names and "pyproject.toml" in names
    assert not [n for n in names if n.startswith("cephcsi/_generated/")], "stubs are build output, git-ignored"
    assert not [n for n in names if ".egg-info/" in n or "/__pycache__/" in n]


def test_wheel_from_a_clean_tree_ships_the_stubs_and_runs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    export_tree(REPO, src)
    assert not (src / "cephcsi" / "_generated").exists()

    # The test venv's interpreter builds and installs: same Python as the bindings.
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(src)])
    wheels = list(dist.glob("cephcsi-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    missing = [f for f in GENERATED if f"cephcsi/_generated/{f}" not in names]
    assert not missing, f"the wheel lacks generated stubs: {missing}"
    assert "cephcsi/_generated/__init__.py" in names

    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    run([base_python, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheels[0])], timeout=600)
    link_ceph_bindings(python)

    # Run from outside the source tree, so nothing but the installed wheel can be imported.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    where = run(
        [str(python), "-c",
         "import cephcsi, cephcsi._generated.csi_pb2 as c, cephcsi._generated.pluginregistration_pb2 as p;"
         "import rados, rbd;"  # the bindings the image links in the same way
         "print(cephcsi.__file__); print(c.DESCRIPTOR.package, p.DESCRIPTOR.package)"],
        cwd=outside, env=env,
    ).stdout.split()
    assert where[0].startswith(str(venv)), f"cephcsi was imported from {where[0]}, not the installed wheel"
    assert where[1:] == ["csi.v1", "pluginregistration"]
    version = run([str(venv / "bin" / "cephcsi"), "--version"], cwd=outside, env=env)
    assert cephcsi.__version__ in version.stdout + version.stderr
