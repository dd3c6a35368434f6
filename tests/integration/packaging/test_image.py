"""The image, built for real from the unmodified Dockerfile by scripts/build-image.sh (podman,
OCI format, base image from debootstrap; see the script), then checked from the outside: the
docker-archive is what `ctr -n k8s.io images import` needs, under the name deploy/ uses; the
image runs cephcsi under Debian sid's Python 3.14 with sid's Ceph Tentacle 20.2 client (the
one client that reads the aes256k keys a fresh Tentacle >= 20.2.4 cluster makes); the build
records every Debian package it installed; and the image's own controller and node plugin
(fuse mapper, podman with the DaemonSet's privileges and mount propagation) run a volume's
whole life against every Ceph release the suite can start: the host's Pacific 16.2.15 (a
cluster older than its client, as mid-upgrade), Reef 18.2.7, and Tentacle 20.2.4 with its stock
aes256k auth (tests/ceph/fixtures.py's release clusters; the session's own is reused).

Cost: ~4 min on the first run of a machine (debootstrap of sid ~1.5 min, build ~2 min, save
~10 s); with the base image and the layer cache warm, a few seconds when nothing changed and
~2 min when cephcsi/ changed (the wheel is rebuilt). Each volume's life cycle takes ~4 s, plus
~10-50 s to start its cluster (~90 s for the three). The e2e harness calls the same build
script; its lock serializes the two.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import cephcsi
from cephcsi._generated import csi_pb2
from tests.ceph.fixtures import CephTestCluster
from tests.integration.controller.helpers import create_request, image_of, mount_cap
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import (
    fuse_daemons_under,
    loops_under,
    mounts_under,
    release_everything,
    remove_tree,
)
from tests.integration.packaging import clusters

pytestmark = [pytest.mark.integration, pytest.mark.packaging, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
BUILD_IMAGE = REPO / "scripts" / "build-image.sh"
# Same limits the script passes: root here lacks CAP_SYS_RESOURCE (see build-image.sh).
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768"]
MiB = 1 << 20


def build_config() -> dict[str, str]:
    proc = subprocess.run(["bash", str(BUILD_IMAGE), "--dry-run"], capture_output=True, text=True, timeout=30, check=True)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def dockerfile_arg(name: str) -> str:
    """An ARG default of the Dockerfile: what the image says it was verified with."""
    found = re.search(rf"^ARG {name}=(\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert found, f"no ARG {name}= in the Dockerfile"
    return found.group(1)


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
def test_the_image_runs_cephcsi_with_sids_tentacle_client(image_tar: Path) -> None:
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
    assert dockerfile_arg("PYTHON_MINOR") == "3.14"
    assert "(3, 14)" in out, "Debian sid's Python, the one its rados/rbd bindings are built for"
    assert f"cephcsi {cephcsi.__version__}" in out
    assert "kmod version" in out
    assert dockerfile_arg("CEPH_CLIENT") == "20.2"
    assert re.search(r"ceph version 20\.2\.\d+ .*tentacle \(stable", out), (
        "Ceph Tentacle 20.2 client: the first that reads aes256k keys\n" + out
    )


@pytest.mark.timeout(1800)
def test_the_build_lists_every_debian_package_of_the_image(image_tar: Path) -> None:
    listing = Path(build_config()["packages"])
    assert listing.is_file(), f"scripts/build-image.sh wrote no {listing}"
    versions = dict(line.split(" ", 1) for line in listing.read_text().splitlines())
    assert versions["ceph-common"].startswith("20.2."), versions["ceph-common"]
    assert versions["librados2"] == versions["librbd1"] == versions["python3-rbd"] == versions["ceph-common"]
    assert versions["python3.14"], "the interpreter the bindings are built for"
    proc = subprocess.run(
        [*podman(), "run", "--rm", "--network", "none", *ULIMITS, "--user", "0", "--entrypoint", "/bin/sh",
         build_config()["image"], "-c", "dpkg-query --show --showformat='${Package}\\n' | wc -l"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert int(proc.stdout) == len(versions), "one line per package of the image"


# ---- the image's controller and node plugin against each release's cluster ---------------------

class ImageDriver(DriverProcess):
    """cephcsi run from the built image (podman, host network: the test clusters listen on
    loopback addresses) instead of the test venv. The socket and config.json are bind-mounted
    at the same paths; the image's non-root USER serves, as in the controller Deployment."""

    image: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.container = f"cephcsi-test-{os.path.basename(self.workdir)}"
        os.chmod(self.workdir, 0o777)  # the image's user 10001 creates the socket here

    def podman_args(self) -> list[str]:
        return ["-v", f"{self.workdir}:{self.workdir}"]

    def command(self) -> list[str]:
        return [
            *podman(), "run", "--rm", "--name", self.container, "--network", "host", *ULIMITS,
            *self.podman_args(), "-v", f"{self.config_file}:{self.config_file}:ro",
            self.image,
            f"--mode={self.mode}", f"--endpoint={self.endpoint}", f"--config-file={self.config_file}",
            "--sidecars=none", "--log-level=debug", *self.args,
        ]

    def cleanup(self) -> None:
        subprocess.run(["podman", "rm", "--force", "--time", "5", self.container], capture_output=True, timeout=60, check=False)
        super().cleanup()


class NodeImageDriver(ImageDriver):
    """The node plugin as deploy/node-daemonset.yaml runs it: root, privileged, host network and
    PID namespace, the host's /dev, and the folder holding the kubelet and state directories
    mounted rshared (the DaemonSet's Bidirectional), so the rbd-fuse, loop and filesystem mounts
    the plugin makes inside the container are the host's."""

    root: str = ""

    def podman_args(self) -> list[str]:
        return ["--user", "0", "--privileged", "--pid", "host", "-v", "/dev:/dev", "-v", f"{self.root}:{self.root}:rshared"]


@pytest.fixture(scope="module", params=clusters.RELEASES)
def cluster(request: pytest.FixtureRequest) -> Iterator[CephTestCluster]:
    """A cluster of each release the image must serve: the session's own when it is that
    release (--ceph-release), else one started for this module (clusters.py)."""
    name = str(request.param)
    if request.config.getoption("--ceph-release") == name:
        yield request.getfixturevalue("ceph_cluster")
        return
    with clusters.started(name) as started:
        yield started


@pytest.fixture
def shared_root() -> Iterator[str]:
    """A short /tmp folder bind-mounted onto itself and made rshared, as the kubelet makes its
    root dir: mounts made inside the node container under it propagate to the host."""
    root = tempfile.mkdtemp(prefix="pk-", dir="/tmp")
    subprocess.run(["mount", "--bind", root, root], check=True, timeout=30)
    subprocess.run(["mount", "--make-rshared", root], check=True, timeout=30)
    try:
        yield root
    finally:
        release_everything(root)
        subprocess.run(["umount", root], capture_output=True, timeout=30, check=False)
        remove_tree(root)


@pytest.mark.ceph
@pytest.mark.timeout(1800)
def test_the_images_controller_and_node_run_a_volumes_life_on_the_cluster(
    image_tar: Path, cluster: CephTestCluster, shared_root: str, tmp_path: Path,
) -> None:
    """CreateVolume → NodeStage (fuse) → NodePublish → write → unpublish, unstage → stage and
    publish again, read it back (no reformat) → unpublish, unstage → DeleteVolume, every call
    served by the image, against the cluster with its own stock keys (aes256k on Tentacle)."""
    assert cluster.key_type == ("aes256k" if cluster.session_name == "tentacle" else "aes"), cluster
    image_name = build_config()["image"]
    root = shared_root
    # Outside the rshared folder: its bind mount into the node container would show up there.
    config = cluster.write_config(tmp_path / "config.json")
    os.chmod(tmp_path, 0o755)
    os.chmod(config, 0o644)
    os.chmod(root, 0o755)
    kubelet, state = os.path.join(root, "kubelet"), os.path.join(root, "state")
    os.makedirs(kubelet)
    rados_timeouts = ["--rados-osd-op-timeout=10", "--rados-mon-op-timeout=10"]
    controller = ImageDriver(config, mode="controller", args=rados_timeouts)
    controller.image = image_name
    os.makedirs(os.path.join(root, "drv"))
    node = NodeImageDriver(
        config, mode="node", workdir=os.path.join(root, "drv"),
        args=["--nodeid=image-node", f"--kubelet-dir={kubelet}", f"--state-dir={state}", "--mounter=fuse"],
    )
    node.image, node.root = image_name, root
    logs: dict[str, str] = {}
    try:
        controller.start(timeout=90)
        node.start(timeout=90)
        volume = controller.controller.CreateVolume(create_request(cluster, size=64 * MiB), timeout=60).volume
        image = image_of(volume.volume_id)
        assert image in cluster.images()
        cap = mount_cap(fs="ext4")
        staging = os.path.join(kubelet, "st", "1")
        target = os.path.join(kubelet, "pods", "1", "mount")
        os.makedirs(staging)
        os.makedirs(os.path.dirname(target))

        def stage_and_publish() -> None:
            node.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(
                volume_id=volume.volume_id, staging_target_path=staging, volume_capability=cap,
                secrets=cluster.secrets, volume_context=volume.volume_context), timeout=120)
            node.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
                volume_id=volume.volume_id, staging_target_path=staging, target_path=target,
                volume_capability=cap), timeout=60)

        def unpublish_and_unstage() -> None:
            node.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
                volume_id=volume.volume_id, target_path=target), timeout=60)
            node.node.NodeUnstageVolume(csi_pb2.NodeUnstageVolumeRequest(
                volume_id=volume.volume_id, staging_target_path=staging), timeout=120)

        stage_and_publish()
        # The container's mounts are the host's: the test writes through the published target.
        with open(os.path.join(target, "data.txt"), "w", encoding="utf-8") as handle:
            handle.write(f"written through the image's node plugin on {cluster.mon_host}")
        assert [m for m in mounts_under(root) if "/fuse/" in m], "the rbd-fuse mount, seen from the host"
        unpublish_and_unstage()
        assert mounts_under(kubelet) == [] and loops_under(root) == [] and fuse_daemons_under(root) == []

        stage_and_publish()
        with open(os.path.join(target, "data.txt"), encoding="utf-8") as handle:
            assert handle.read() == f"written through the image's node plugin on {cluster.mon_host}"
        unpublish_and_unstage()
        assert mounts_under(root) == [] and loops_under(root) == [] and fuse_daemons_under(root) == []

        controller.controller.DeleteVolume(
            csi_pb2.DeleteVolumeRequest(volume_id=volume.volume_id, secrets=cluster.secrets), timeout=60,
        )
        assert image not in cluster.images()
    finally:
        for name, driver in (("node", node), ("controller", controller)):
            logs[name] = driver.log()
            driver.stop()
            subprocess.run(["podman", "rm", "--force", "--time", "5", driver.container],
                           capture_output=True, timeout=60, check=False)
        release_everything(root)
        node.cleanup()
        controller.cleanup()
    for name, log in logs.items():
        assert "Traceback" not in log, f"{name}:\n{log[-4000:]}"
        assert cluster.key not in log and cluster.admin_key not in log, f"a cephx key in the {name}'s log"
