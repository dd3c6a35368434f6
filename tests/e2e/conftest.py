"""Fixtures of the e2e tests: one real node for the whole package (tests/e2e/env.py).

Start-up (image build from cache, node, Ceph, install) takes ~30 s on a warm machine and several
minutes on a fresh one (debootstrap, image build); it is timed by its own deadlines, so the
tests carry `timeout(..., func_only=True)` and pytest-timeout times only the test bodies.

The e2e tests run after every other test of the session (see pytest_collection_modifyitems):
the node's containers unshare mount namespaces, and a namespace created while another test's
volumes are mounted keeps copies of those mounts, making their unmount fail with "busy". The
node is torn down when the package's last test finishes (package scope).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.env import E2EEnv, start_env
from tests.integration.encryption.vault_server import VaultServer, binary_path

log = logging.getLogger(__name__)
E2E_DIR = os.path.dirname(os.path.abspath(__file__))


# Scenario order: the basic volume paths first (a failure there explains later ones), the
# disruptive ones (restarts, a killed leader, a config edit) after them.
MODULE_ORDER = ("test_registrar.py", "test_volumes.py", "test_expansion.py", "test_snapshots.py",
                "test_encrypted_file.py", "test_demo.py",
                "test_qos.py", "test_restarts.py", "test_burst.py", "test_config.py", "test_releases.py")


def _rank(item: pytest.Item) -> int:
    name = item.path.name
    return MODULE_ORDER.index(name) if name in MODULE_ORDER else len(MODULE_ORDER)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the e2e tests to the end of the run, in MODULE_ORDER (stable within a module)."""
    inside = [item for item in items if str(item.path).startswith(E2E_DIR + os.sep)]
    if not inside:
        return
    outside = [item for item in items if not str(item.path).startswith(E2E_DIR + os.sep)]
    items[:] = outside + sorted(inside, key=_rank)


@pytest.fixture(scope="package")
def e2e() -> Iterator[E2EEnv]:
    if os.geteuid() != 0:
        pytest.skip("the e2e node (kubelet, containerd, mounts, iptables) needs root")
    env = start_env()
    log.info("e2e start-up timings: %s", env.timings.steps)
    try:
        yield env
    finally:
        failed = env.stop()
        if failed:
            # Teardown problems are reported, not raised: the tests' own results stand, and
            # the next session's start clears what is left (see NodeHost.clear_leftovers).
            log.warning("e2e teardown left problems: %s", failed)


@pytest.fixture(scope="package")
def e2e_vault(e2e: E2EEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VaultServer]:
    """One real Vault (dev mode, in memory; tests/integration/encryption/vault_server.py) for the
    e2e tests, started on first use and listening on the node IP: the only address both driver
    pods reach (the node plugin has the host's network, the controller a pod's)."""
    binary = binary_path()
    if not binary.is_file():
        pytest.skip(f"no Vault server binary at {binary}: run scripts/build_vault.sh (or scripts/setup.sh)")
    server = VaultServer(binary=binary, work_dir=Path(tmp_path_factory.mktemp("e2e-vault")), host=e2e.node.ip)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace(e2e: E2EEnv) -> Iterator[str]:
    """A fresh namespace for the test's claims and pods, deleted afterwards (the driver then
    releases whatever the test left)."""
    name = e2e.new_namespace()
    yield name
    e2e.kube.delete_namespace(name)
