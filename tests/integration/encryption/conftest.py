"""Fixtures of the encryption integration tests."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.ceph.fixtures import CephTestCluster
from tests.integration.driver import DriverProcess
from tests.integration.encryption.vault_server import VaultServer, binary_path

METADATA_KMS = {"meta": {"encryptionKMSType": "metadata"}}


class KmsController(NamedTuple):
    """What a controller with a KMS configuration is started with: its config.json and arguments."""

    config: str
    args: list[str]


def _write_kms(cluster: CephTestCluster, where: Path, kms: dict[str, Any], *args: str) -> KmsController:
    config = cluster.write_config(where / "config.json")
    path = where / "kms.json"
    path.write_text(json.dumps(kms))
    return KmsController(config, [f"--kms-config={path}", *args])


@pytest.fixture(scope="module")
def kms_driver(ceph_cluster: CephTestCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DriverProcess]:
    """One controller for a module: KMS id "meta" (metadata) and "odd" (kmip, a type the driver refuses)."""
    started = _write_kms(ceph_cluster, tmp_path_factory.mktemp("kms"),
                         {**METADATA_KMS, "odd": {"encryptionKMSType": "kmip"}})
    process = DriverProcess(started.config, mode="controller", args=started.args)
    process.start()
    try:
        yield process
    finally:
        process.cleanup()


@pytest.fixture
def kms_controller(ceph_cluster: CephTestCluster, tmp_path: Path) -> Callable[..., KmsController]:
    """config.json and a KMS configuration (default: "meta", the metadata KMS) in the test's
    tmp_path, and the arguments for controllers a test kills and restarts: a 2 s journal lock
    timeout, so a killed controller's lease lapses quickly."""
    def write(kms: dict[str, Any] | None = None) -> KmsController:
        return _write_kms(ceph_cluster, tmp_path, METADATA_KMS if kms is None else kms, "--journal-lock-timeout=2s")
    return write


@pytest.fixture(scope="session")
def vault_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultServer]:
    """A real Vault (dev mode, in memory) on 127.0.0.1 with KV mounts secret/ (v2), kv1/ (v1)
    and kv2/ (v2); stopped at the end of the session."""
    binary = binary_path()
    if not binary.is_file():
        pytest.skip(f"no Vault server binary at {binary}: run scripts/build_vault.sh (or scripts/setup.sh)")
    server = VaultServer(binary=binary, work_dir=Path(tmp_path_factory.mktemp("vault")))
    server.start()
    try:
        server.setup_mounts()
        yield server
    finally:
        server.stop()
