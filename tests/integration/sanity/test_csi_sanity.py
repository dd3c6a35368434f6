"""csi-sanity, the CSI community's conformance suite, against a real cephcsi on real Ceph.

Runs for access type mount and block, and once with the Controller service on its own socket.
Every spec that applies to the advertised capabilities runs (no --ginkgo.skip); the passed
count must reach the number expected for those capabilities, so a capability silently dropped
(and the specs it gates skipped) fails this test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.sanity]

SECRET_KINDS = (
    "CreateVolumeSecret", "DeleteVolumeSecret", "ControllerPublishVolumeSecret", "ControllerUnpublishVolumeSecret",
    "ControllerValidateVolumeCapabilitiesSecret", "NodeStageVolumeSecret", "NodePublishVolumeSecret",
    "CreateSnapshotSecret", "DeleteSnapshotSecret", "ListSnapshotsSecret", "ControllerExpandVolumeSecret",
    "ControllerModifyVolumeSecret",
)
# Specs csi-sanity v5.6.0 runs for what cephcsi advertises (see README "Conformance"); v5.4.0 had a
# race in its connect helper (a connection Ready before its first state check waited out the minute).
EXPECTED_PASSED = {"mount": 87, "block": 87}  # +6: GroupController (capabilities, group snapshot argument checks); +19: snapshots, ListSnapshots, create from snapshot/volume; +7: expansion; +8: ControllerPublish/Unpublish; +1: GetCapacity; +8: ModifyVolume and CreateVolume with mutable_parameters
MUTABLE_PARAMETERS = {"baseIops": "500", "baseReadBps": "104857600"}
"""A VolumeAttributesClass's RBD QoS (docs/qos.md) for the ModifyVolume specs."""
VOLUME_SIZE = 256 << 20  # whole MiB, so rounding never changes the size the suite checks


@dataclass
class SanityResult:
    passed: int
    failed: list[str]
    skipped: int
    output: str
    skipped_names: list[str]


def _csi_sanity() -> str:
    found = shutil.which("csi-sanity") or os.path.expanduser("~/go/bin/csi-sanity")
    if not os.path.exists(found):
        pytest.fail("csi-sanity is not installed: run ./scripts/setup.sh")
    return found


def _run_sanity(driver: DriverProcess, cluster: CephTestCluster, access_type: str, controller_endpoint: str = "") -> SanityResult:
    work = tempfile.mkdtemp(prefix="san-", dir="/tmp")
    try:
        params = os.path.join(work, "params.yaml")
        secrets = os.path.join(work, "secrets.yaml")
        junit = os.path.join(work, "junit.xml")
        with open(params, "w") as handle:
            yaml.safe_dump(cluster.parameters, handle)
        with open(secrets, "w") as handle:
            yaml.safe_dump({kind: cluster.secrets for kind in SECRET_KINDS}, handle)
        os.chmod(secrets, 0o600)
        mutable = os.path.join(work, "mutable.yaml")
        with open(mutable, "w") as handle:
            yaml.safe_dump(MUTABLE_PARAMETERS, handle)
        argv = [
            _csi_sanity(),
            f"--csi.endpoint={driver.endpoint}",
            f"--csi.stagingdir={work}/staging",
            f"--csi.mountdir={work}/mount",
            f"--csi.testvolumeparameters={params}",
            f"--csi.testvolumemutableparameters={mutable}",
            f"--csi.secrets={secrets}",
            f"--csi.testvolumesize={VOLUME_SIZE}",
            f"--csi.testvolumeexpandsize={2 * VOLUME_SIZE}",
            f"--csi.testvolumeaccesstype={access_type}",
            f"--csi.junitfile={junit}",
            "--ginkgo.timeout=30m",
        ]
        if controller_endpoint:
            argv.append(f"--csi.controllerendpoint={controller_endpoint}")
        out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        root = ET.parse(junit).getroot()
        passed, skipped, failed, skipped_names = 0, 0, [], []
        for case in root.iter("testcase"):
            name = case.get("name", "")
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(name)
            elif case.find("skipped") is not None:
                skipped += 1
                skipped_names.append(name)
            else:
                passed += 1
        return SanityResult(passed, failed, skipped, out.stdout[-20000:] + out.stderr[-5000:], skipped_names)
    finally:
        _cleanup_mounts(work)
        shutil.rmtree(work, ignore_errors=True)


def _cleanup_mounts(work: str) -> None:
    """Never leave a mount under the work dir behind (a failed spec may)."""
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle if f" {work}/" in line]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)


@pytest.fixture(scope="module")
def sanity_config(ceph_cluster: CephTestCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    return ceph_cluster.write_config(tmp_path_factory.mktemp("san") / "config.json")


def _driver(config: str, extra: list[str]) -> DriverProcess:
    driver = DriverProcess(config, mode="all")
    driver.args = ["--nodeid=sanity-node", "--kubelet-dir=", f"--state-dir={driver.workdir}/state", "--log-level=info", *extra]
    return driver


@pytest.fixture(scope="module")
def sanity_driver(sanity_config: str) -> Iterator[DriverProcess]:
    driver = _driver(sanity_config, []).start()
    yield driver
    driver.cleanup()


@pytest.mark.parametrize("access_type", ["mount", "block"])
def test_csi_sanity(sanity_driver: DriverProcess, ceph_cluster: CephTestCluster, access_type: str) -> None:
    images_before = set(ceph_cluster.images())
    result = _run_sanity(sanity_driver, ceph_cluster, access_type)
    print(f"csi-sanity {access_type}: {result.passed} passed, {len(result.failed)} failed, {result.skipped} skipped:",
          *sorted(result.skipped_names), sep="\n  ")
    assert not result.failed, f"failed specs: {result.failed}\n{result.output}\n--- driver log tail ---\n{sanity_driver.log()[-8000:]}"
    assert result.passed >= EXPECTED_PASSED[access_type], f"only {result.passed} specs passed\n{result.output}"
    assert set(ceph_cluster.images()) == images_before, "csi-sanity left images behind"


def test_csi_sanity_with_a_separate_controller_socket(sanity_config: str, ceph_cluster: CephTestCluster) -> None:
    driver = _driver(sanity_config, [])
    controller_socket = os.path.join(driver.workdir, "controller.sock")
    driver.args = [*driver.args, f"--controllerendpoint=unix://{controller_socket}"]
    driver.start()
    try:
        result = _run_sanity(driver, ceph_cluster, "mount", controller_endpoint=f"unix://{controller_socket}")
    finally:
        driver.cleanup()
    assert not result.failed, f"failed specs: {result.failed}\n{result.output}"
    assert result.passed >= EXPECTED_PASSED["mount"]
