"""Fixtures of the encryption integration tests."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.encryption.vault_server import VaultServer, binary_path


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
