"""The session's Ceph cluster is the release and auth variant --ceph-release asked for, and its
mgr runs the rbd_support module the driver hands purges and flattens to."""
from __future__ import annotations

import json

import pytest

from tests.ceph.fixtures import CephTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

CODENAMES = {"pacific": "16.2.", "reef": "18.2.", "tentacle": "20.2."}


def test_every_daemon_runs_the_release_asked_for(ceph_cluster: CephTestCluster, request: pytest.FixtureRequest) -> None:
    assert ceph_cluster.session_name == request.config.getoption("--ceph-release")
    versions = json.loads(ceph_cluster.admin("ceph", "versions", "--format", "json"))
    for daemon in ("mon", "mgr", "osd"):
        (line,) = versions[daemon]  # one version per daemon kind
        assert f"ceph version {ceph_cluster.version} " in line and ceph_cluster.release in line, (daemon, line)
    assert ceph_cluster.version.startswith(CODENAMES[ceph_cluster.release])


def test_the_keys_are_of_the_type_the_env_file_says(ceph_cluster: CephTestCluster) -> None:
    prefix = {"aes": "AQ", "aes256k": "Ag"}[ceph_cluster.key_type]
    assert ceph_cluster.key.startswith(prefix) and ceph_cluster.admin_key.startswith(prefix)
    stock_tentacle = ceph_cluster.release == "tentacle" and ceph_cluster.auth == "stock"
    assert (ceph_cluster.key_type == "aes256k") == stock_tentacle
    if ceph_cluster.release == "tentacle":
        monmap = json.loads(ceph_cluster.admin("ceph", "mon", "dump", "--format", "json"))
        allowed = {cipher["name"] for cipher in monmap["auth_allowed_ciphers"]}
        # A legacy cluster allows aes beside aes256k, as an upgraded one does; a stock one does not.
        assert allowed == ({"aes", "aes256k"} if ceph_cluster.auth == "legacy" else {"aes256k"})


def test_the_mgr_runs_rbd_support(ceph_cluster: CephTestCluster) -> None:
    health = ceph_cluster.admin("ceph", "health", "detail", "--format", "json")
    assert "rbd_support" not in health, health
    # rbd_support answers its commands (the task queue the driver's purges go to).
    tasks = json.loads(ceph_cluster.admin("ceph", "rbd", "task", "list", "--format", "json") or "[]")
    assert isinstance(tasks, list)
