"""A key this node's Ceph client cannot read gets an error that says so, and no key reaches a log.

On this host the client is Pacific 16.2.15 (librados in the driver, rbd/rbd-fuse on the node),
which cannot decode the aes256k keys a Tentacle 20.2.4+ cluster makes: without the driver's check
librados and the tools print such a key whole on stderr (the controls below show it still would).
The last test greps every log this module's drivers, the node's rbd-fuse and the Ceph cluster
keep for every key used, in every form (cephcsi.ceph.cephx_keys.forms) and in part.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator

import grpc
import pytest

from cephcsi._generated import csi_pb2
from cephcsi.ceph import cephx_keys
from tests.ceph.fixtures import CephTestCluster
from tests.integration import driver as driver_module
from tests.integration.auth import keys
from tests.integration.driver import DriverProcess
from tests.integration.node.conftest import NodeEnv, Volume, assert_no_leftovers, expect_code, mount_cap

pytestmark = [pytest.mark.integration, pytest.mark.ceph]

FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
CLIENT = cephx_keys.library_client()
needs_old_client = pytest.mark.skipif(
    CLIENT.reads_aes256k, reason=f"this host's Ceph client ({CLIENT.describe()}) reads aes256k keys: nothing to refuse")


@pytest.fixture(scope="module")
def aes256k(ceph_cluster: CephTestCluster) -> Iterator[str]:
    """On a stock Tentacle session cluster, its own csi key (exactly what a new user has)."""
    if ceph_cluster.key_type == "aes256k":
        yield ceph_cluster.key
        return
    key, origin = keys.aes256k_key()
    print(f"aes256k key: {origin}")
    yield key


def readable(cluster: CephTestCluster) -> bool:
    """Whether this host's client can use the session cluster's own keys."""
    return cluster.key_type == "aes" or CLIENT.reads_aes256k


def assert_no_trace(text: str, key: str, where: str) -> None:
    leaked = [piece for piece in keys.fragments(key) if piece in text]
    assert not leaked, f"{where} holds part of the key"  # never the key itself in the report


def create_request(cluster: CephTestCluster, secrets: dict[str, str]) -> csi_pb2.CreateVolumeRequest:
    cap = mount_cap()
    return csi_pb2.CreateVolumeRequest(
        name=f"auth-{uuid.uuid4().hex[:8]}", capacity_range=csi_pb2.CapacityRange(required_bytes=16 << 20),
        volume_capabilities=[cap], parameters=cluster.parameters, secrets=secrets,
    )


@needs_old_client
def test_controller_names_the_cipher_the_client_and_both_ways_out(
        controller: DriverProcess, ceph_cluster: CephTestCluster, aes256k: str) -> None:
    images = ceph_cluster.images()
    secrets = {"userID": ceph_cluster.user, "userKey": aes256k}
    message = expect_code(FAILED_PRECONDITION, controller.controller.CreateVolume,
                          create_request(ceph_cluster, secrets), timeout=60)
    assert "aes256k" in message and f"librados {CLIENT.version}" in message
    assert "Tentacle 20.2.4 or newer libraries" in message
    for command in ("ceph config set mon mon_auth_allow_insecure_key true",
                    "ceph mon set auth_allowed_ciphers aes256k,aes", "--key-type aes"):
        assert command in message
    assert "check the secret" not in message
    assert_no_trace(message, aes256k, "the gRPC error")
    assert_no_trace(controller.log(), aes256k, "the controller's log")
    assert "failed to decode key" not in controller.log()
    assert ceph_cluster.images() == images


def test_a_cut_key_is_invalid_argument_naming_the_field(controller: DriverProcess, ceph_cluster: CephTestCluster,
                                                         aes256k: str) -> None:
    cut = aes256k[:-4]
    message = expect_code(grpc.StatusCode.INVALID_ARGUMENT, controller.controller.CreateVolume,
                          create_request(ceph_cluster, {"userID": ceph_cluster.user, "userKey": cut}), timeout=60)
    assert "userKey is not a cephx key" in message and cut not in message
    assert "failed to decode key" not in controller.log()


_OPEN = textwrap.dedent("""
    import json, sys
    from cephcsi.ceph.connection import open_rados
    from cephcsi.ceph.credentials import Credentials
    from cephcsi.config.clusters import ClusterConfig
    from cephcsi.settings import CephSettings
    mon, user, key = sys.argv[1:4]
    try:
        open_rados(ClusterConfig("auth", (mon,)), Credentials(user, key), CephSettings(mount_timeout=3.0)).shutdown()
        print(json.dumps({"connected": True}))
    except Exception as error:
        print(json.dumps({"type": type(error).__name__, "message": str(error)}))
""")
_RAW = textwrap.dedent("""
    import sys, rados
    mon, user, key = sys.argv[1:4]
    handle = rados.Rados(rados_id=user, conf={"mon_host": mon, "log_to_stderr": "false", "err_to_stderr": "false",
                                              "log_file": "", "key": key, "client_mount_timeout": "3"})
    try:
        handle.connect(timeout=3)
    except rados.Error as error:
        print(type(error).__name__)
""")


@needs_old_client
def test_the_connection_layer_never_lets_librados_print_the_key(ceph_cluster: CephTestCluster, aes256k: str) -> None:
    args = [ceph_cluster.mon_host, ceph_cluster.user, aes256k]
    ours = subprocess.run([sys.executable, "-c", _OPEN, *args], capture_output=True, text=True, timeout=60)
    outcome = json.loads(ours.stdout.strip().splitlines()[-1])
    assert outcome["type"] == "FailedPrecondition", outcome
    assert_no_trace(ours.stdout + ours.stderr, aes256k, "the connection layer's output")
    assert "failed to decode key" not in ours.stderr
    # Control: the same key handed to this librados directly, with every log setting off, is
    # printed on stderr; the check above is what keeps it out.
    raw = subprocess.run([sys.executable, "-c", _RAW, *args], capture_output=True, text=True, timeout=60)
    assert "failed to decode key" in raw.stderr and aes256k in raw.stderr
    if not readable(ceph_cluster):
        return
    # A key this client reads connects through the same path.
    fine = subprocess.run([sys.executable, "-c", _OPEN, ceph_cluster.mon_host, ceph_cluster.user, ceph_cluster.key],
                          capture_output=True, text=True, timeout=60)
    assert json.loads(fine.stdout.strip().splitlines()[-1]) == {"connected": True}, fine.stderr


def stage_with(volume: Volume, staging: str, secrets: dict[str, str]) -> csi_pb2.NodeStageVolumeRequest:
    return csi_pb2.NodeStageVolumeRequest(
        volume_id=volume.volume_id, staging_target_path=staging, volume_capability=mount_cap(),
        secrets=secrets, volume_context={**volume.context, "mounter": "fuse"},
    )


@needs_old_client
def test_rbd_fuse_is_never_started_with_a_key_it_cannot_read(env: NodeEnv, make_volume: Callable[..., Volume],
                                                              aes256k: str) -> None:
    volume = make_volume()
    staging = env.staging()
    secrets = {"userID": env.cluster.user, "userKey": aes256k}
    message = expect_code(FAILED_PRECONDITION, env.node.NodeStageVolume, stage_with(volume, staging, secrets), timeout=120)
    tools = subprocess.run(["rbd", "--version"], capture_output=True, text=True, check=True).stdout
    assert "aes256k" in message and "rbd-fuse" in message and f"{cephx_keys.parse_version(tools)}" in message
    assert "--key-type aes" in message
    assert_no_trace(message, aes256k, "the NodeStageVolume error")
    assert_no_trace(env.driver.log(), aes256k, "the node plugin's log")
    assert_no_leftovers(env, volume)
    # Control: rbd-fuse itself, given this key in a key file, prints it on stderr.
    keyfile = os.path.join(env.root, "control.key")
    with open(os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as handle:
        handle.write(aes256k)
    mount_dir = os.path.join(env.root, "control-mnt")
    os.makedirs(mount_dir, exist_ok=True)
    try:
        control = subprocess.run(
            ["rbd-fuse", "-c", "/dev/null", "-m", env.cluster.mon_host, "--id", env.cluster.user,
             f"--keyfile={keyfile}", "--client-mount-timeout=3", "-r", volume.image, mount_dir],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    finally:
        os.unlink(keyfile)
    assert control.returncode != 0 and aes256k in control.stderr, control.returncode
    os.rmdir(mount_dir)


def test_the_leak_search_finds_a_key_in_any_form(tmp_path: pathlib.Path, aes256k: str) -> None:
    """The search below must be able to fail: each form of a key, whole or cut, is found."""
    secret = base64.b64decode(aes256k)[12:]
    for name, text in (("whole", aes256k), ("cut", aes256k[20:40]), ("secret", base64.b64encode(secret).decode()),
                       ("hex", secret.hex()), ("hex-upper", secret.hex().upper()[:30])):
        path = os.path.join(str(tmp_path), f"{name}.log")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(f"2026-11-27 client log line {text} more\n")
        assert [leak.key_name for leak in keys.find_leaks([path], {"k": aes256k})] == ["k"], name
    clean = os.path.join(str(tmp_path), "clean.log")
    with open(clean, "w", encoding="utf-8") as handle:
        handle.write(f"nothing here but a header {aes256k[:16]}\n")
    assert keys.find_leaks([clean], {"k": aes256k}) == []


def test_no_key_in_any_log(env: NodeEnv, make_volume: Callable[..., Volume], controller: DriverProcess,
                           ceph_cluster: CephTestCluster, aes256k: str) -> None:
    """Every key this run used, searched for in every log it keeps: the cluster's daemons' and
    CLI clients' logs, every driver process's log still on disk (this module's controller and
    node plugin included, after the refusals above), and the node's state directory while an
    rbd-fuse mapping made with the real key is live (its ceph.conf and rbd-fuse.log)."""
    volume = make_volume()
    used = {"the csi user's key": ceph_cluster.key, "client.admin's key": ceph_cluster.admin_key,
            "the aes256k key": aes256k}
    leaks: list[keys.Leak] = []
    if readable(ceph_cluster):  # else the stage is the refusal tested above
        staging = env.staging()
        env.node.NodeStageVolume(stage_with(volume, staging, env.cluster.secrets), timeout=120)
        try:
            fuse_logs = keys.files_under([os.path.join(env.state, "fuse")])
            assert any(path.endswith("rbd-fuse.log") for path in fuse_logs), fuse_logs  # searched while it exists
            leaks += keys.find_leaks([os.path.join(env.state, "fuse")], used)
        finally:
            volume.unstage(staging)
    driver_logs = [d.log_path for d in driver_module._STARTED if os.path.exists(d.log_path)]
    assert controller.log_path in driver_logs and env.driver.log_path in driver_logs
    cluster_logs = os.path.join(ceph_cluster.directory, "log")
    assert keys.files_under([cluster_logs]), "the cluster keeps no logs where expected"
    leaks += keys.find_leaks([*driver_logs, cluster_logs], used)
    assert not leaks, "\n".join(str(leak) for leak in leaks)
    assert_no_leftovers(env, volume)
