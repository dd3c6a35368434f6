"""A Tentacle cluster that allows only aes256k refuses a legacy aes key; the driver's error says so.

Its own stock Tentacle 20.2.4 cluster (whatever --ceph-release the session runs), turned into the
state of an upgraded cluster at the end of its key migration: aes allowed, an aes user made with
the commands docs/troubleshooting.md gives, then `auth_allowed_ciphers` back to aes256k only. The
key is right and this host's client reads it, so "check the userKey" would be the wrong advice.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph import cephx_keys
from tests.ceph.fixtures import CephTestCluster, running_cluster
from tests.integration.auth import keys
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import expect_code, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph, pytest.mark.slow]

USER = "legacy"
CAPS = ("mon", "profile rbd", "osd", "profile rbd pool=rbd", "mgr", "profile rbd pool=rbd")
_CONNECT = textwrap.dedent("""
    import json, sys
    from cephcsi.ceph.connection import open_rados
    from cephcsi.ceph.credentials import Credentials
    from cephcsi.config.clusters import ClusterConfig
    from cephcsi.settings import CephSettings
    mon, user, key = sys.argv[1:4]
    try:
        open_rados(ClusterConfig("t", (mon,)), Credentials(user, key), CephSettings(mount_timeout=5.0)).shutdown()
        print(json.dumps("connected"))
    except Exception as error:
        print(json.dumps(type(error).__name__))
""")


@pytest.fixture(scope="module")
def tentacle() -> Iterator[CephTestCluster]:
    with running_cluster("ct-", release="tentacle") as cluster:
        yield cluster


def connects(cluster: CephTestCluster, key: str) -> str:
    done = subprocess.run([sys.executable, "-c", _CONNECT, cluster.mon_host, USER, key],
                          capture_output=True, text=True, timeout=60)
    return str(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_refused_aes_key_is_blamed_on_the_allowed_ciphers_first(tentacle: CephTestCluster,
                                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    assert tentacle.key_type == "aes256k" and tentacle.version.startswith("20.")
    tentacle.admin("ceph", "config", "set", "mon", "mon_auth_allow_insecure_key", "true")
    tentacle.admin("ceph", "mon", "set", "auth_allowed_ciphers", "aes256k,aes")
    tentacle.admin("ceph", "auth", "get-or-create", f"client.{USER}", *CAPS, "--key-type", "aes")
    key = tentacle.admin("ceph", "auth", "get-key", f"client.{USER}").strip()
    assert cephx_keys.inspect(key).cipher_name == "aes"
    health = json.loads(tentacle.admin("ceph", "health", "detail", "--format", "json"))["checks"]
    assert {"AUTH_INSECURE_KEYS_ALLOWED", "AUTH_INSECURE_CLIENT_KEY_TYPE"} <= set(health), sorted(health)
    assert connects(tentacle, key) == "connected"  # the key is right, and this client reads it

    tentacle.admin("ceph", "mon", "set", "auth_allowed_ciphers", "aes256k")
    config = tentacle.write_config(tmp_path_factory.mktemp("tentacle") / "config.json")
    controller = DriverProcess(config, mode="controller", args=["--client-mount-timeout=4"])
    controller.start()
    try:
        request = csi_pb2.CreateVolumeRequest(
            name=f"auth-{uuid.uuid4().hex[:8]}", capacity_range=csi_pb2.CapacityRange(required_bytes=16 << 20),
            volume_capabilities=[mount_cap()], parameters=tentacle.parameters,
            secrets={"userID": USER, "userKey": key})
        message = expect_code(grpc.StatusCode.UNAVAILABLE, controller.controller.CreateVolume, request, timeout=60)
        log = controller.log()
    finally:
        controller.cleanup()
    assert "legacy aes cephx key" in message and "auth_allowed_ciphers aes256k,aes" in message
    assert message.index("auth_allowed_ciphers") < message.index("userID/userKey")
    assert f"librados {cephx_keys.library_client().version}" in message
    used = {"the legacy key": key, "the cluster's admin key": tentacle.admin_key, "its csi key": tentacle.key}
    for name, secret in used.items():
        assert not [p for p in keys.fragments(secret) if p in message + log], f"{name} in the error or driver log"
    leaks = keys.find_leaks([os.path.join(tentacle.directory, "log")], used)
    assert not leaks, "\n".join(str(leak) for leak in leaks)
