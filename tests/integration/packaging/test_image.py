"""The image, built for real from the unmodified Dockerfile by scripts/build-image.sh (podman,
OCI format, base image from debootstrap; see the script), then checked from the outside: the
docker-archive is what `ctr -n k8s.io images import` needs, under the name deploy/ uses, and
the image runs cephcsi with Debian trixie's Ceph client, and that client (Reef) works against
the test cluster (bookworm's Pacific), the mixed-version case of a cluster mid-upgrade.

Cost: ~2 min on the first run of a machine (debootstrap ~40 s, build ~60 s, save ~5 s); with
the base image and the layer cache warm, a few seconds when nothing changed and ~25 s when
cephcsi/ changed. The e2e harness calls the same script; its lock serializes the two.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import cephcsi
from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.packaging, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
BUILD_IMAGE = REPO / "scripts" / "build-image.sh"
# Same limits the script passes: root here lacks CAP_SYS_RESOURCE (see build-image.sh).
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]


def build_config() -> dict[str, str]:
    proc = subprocess.run(["bash", str(BUILD_IMAGE), "--dry-run"], capture_output=True, text=True, timeout=30, check=True)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def podman() -> list[str]:
    """podman with the OCI runtime the build script uses (see its oci_runtime)."""
    return ["podman", "--runtime", build_config()["runtime"]]


@pytest.fixture(scope="module")
def image_tar() -> Path:
    for tool in ("podman", "debootstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run scripts/setup.sh (scripts/packages.sh test lists it)")
    proc = subprocess.run(["bash", str(BUILD_IMAGE)], capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, f"scripts/build-image.sh failed:\n{proc.stderr[-6000:]}"
    path = Path(proc.stdout.strip().splitlines()[-1])
    assert path.is_file(), proc.stdout
    return path


@pytest.mark.timeout(1800)
def test_the_archive_is_a_docker_archive_named_as_deploy_expects(image_tar: Path) -> None:
    with tarfile.open(image_tar) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))  # type: ignore[arg-type]
    (entry,) = manifest
    assert entry["RepoTags"] == [build_config()["image"]] == ["docker.io/library/cephcsi:0.1.0"]
    assert entry["Layers"], "an image with layers"


@pytest.mark.timeout(1800)
def test_the_image_runs_cephcsi_with_the_trixie_ceph_client(image_tar: Path) -> None:
    image = build_config()["image"]
    inspect = json.loads(subprocess.run([*podman(), "image", "inspect", image], capture_output=True, text=True,
                                        timeout=60, check=True).stdout)[0]
    config = inspect["Config"]
    assert config["Entrypoint"] == ["cephcsi"]
    assert config["User"] == "10001:10001"
    assert not [e for e in config.get("Env", []) if e.startswith(("PIP_", "SSL_CERT", "REQUESTS_CA"))]
    script = (
        "python -c 'import rados, rbd, cephcsi._generated.csi_pb2, sys; print(sys.version_info[:2])' && "
        "cephcsi --version && modprobe --version && command -v rbd-fuse rbd-nbd losetup && rbd --version && "
        "test ! -e /etc/pip.conf && test ! -e /root/.config/pip"
    )
    proc = subprocess.run(
        [*podman(), "run", "--rm", "--network", "none", *ULIMITS, "--user", "0", "--entrypoint", "/bin/sh", image, "-c", script],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "(3, 13)" in out, "Debian trixie's Python, the one its rados/rbd bindings are built for"
    assert f"cephcsi {cephcsi.__version__}" in out
    assert "kmod version" in out
    assert "reef (stable)" in out, "Ceph Reef 18.2 client (bookworm's Pacific is end of life)"


# ---- the image's Reef client against the Pacific test cluster --------------------------------

class ImageDriver(DriverProcess):
    """cephcsi run from the built image (podman, host network: the test cluster listens on
    127.0.0.1) instead of the test venv. The socket and config.json are bind-mounted at the
    same paths; the image's non-root USER serves, as in the controller Deployment."""

    image: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.container = f"cephcsi-test-{os.path.basename(self.workdir)}"
        os.chmod(self.workdir, 0o777)  # the image's user 10001 creates the socket here

    def command(self) -> list[str]:
        return [
            *podman(), "run", "--rm", "--name", self.container, "--network", "host", *ULIMITS,
            "-v", f"{self.workdir}:{self.workdir}", "-v", f"{self.config_file}:{self.config_file}:ro",
            self.image,
            f"--mode={self.mode}", f"--endpoint={self.endpoint}", f"--config-file={self.config_file}",
            "--sidecars=none", "--log-level=debug", *self.args,
        ]

    def cleanup(self) -> None:
        subprocess.run(["podman", "rm", "--force", "--time", "5", self.container], capture_output=True, timeout=60, check=False)
        super().cleanup()


@pytest.mark.ceph
@pytest.mark.timeout(1800)
def test_the_images_reef_client_creates_and_deletes_on_the_pacific_cluster(
    image_tar: Path, ceph_cluster: CephTestCluster, tmp_path: Path,
) -> None:
    config = ceph_cluster.write_config(tmp_path / "config.json")
    os.chmod(tmp_path, 0o755)
    os.chmod(config, 0o644)
    driver = ImageDriver(config, mode="controller", args=["--rados-osd-op-timeout=10", "--rados-mon-op-timeout=10"])
    driver.image = build_config()["image"]
    driver.start(timeout=90)
    try:
        volume = driver.controller.CreateVolume(create_request(ceph_cluster), timeout=60).volume
        image = image_of(volume.volume_id)
        assert image in ceph_cluster.images()
        driver.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=ceph_cluster.secrets), timeout=60,
        )
        assert image not in ceph_cluster.images()
    finally:
        log = driver.log()
        driver.cleanup()
    assert "Traceback" not in log, log[-4000:]
