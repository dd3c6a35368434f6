"""pytest fixtures for the real one-node Ceph cluster started by tests/ceph/cluster.sh.

Ceph releases: the host's Pacific 16.2.15, and Reef 18.2.7 (Debian trixie) and Tentacle 20.2.4
(sid) from roots tests/ceph/releases.sh debootstraps (cached under ~/.cache/cephcsi; the daemons
and the admin CLI run through chroot, on 127.0.0.8 and 127.0.0.9). Python API:

    start_cluster(directory, release="pacific"|"reef"|"tentacle", auth="stock"|"legacy",
                  address=None) -> CephTestCluster   # builds the release's root first if it is not cached
    stop_cluster(directory)            # stops the daemons, unmounts what start bound
    release_root(release) -> str       # the root's path (built once, then cached)
    cached_release_root(release) -> str | None   # the root's path if built, else None
    session_release(name) -> (release, auth)   # "tentacle-legacy" -> ("tentacle", "legacy")

A CephTestCluster says what it is: `release`, `version` ("18.2.7"), `auth` and `key_type` ("aes"
for `AQ...` keys, "aes256k" for `Ag...` ones: Tentacle's stock keys, which Pacific and Reef
clients cannot parse), `root` ("" for the host's packages). `admin(tool, ...)` runs a ceph/rbd
command of the cluster's own release; `cli(tool, ...)` gives that argv.

The session fixture `ceph_cluster` runs the release `--ceph-release` names (pacific by default,
or CEPHCSI_CEPH_RELEASE): pacific, reef, tentacle-legacy (aes keys, as an upgraded cluster has;
the host's Pacific client works) or tentacle (stock aes256k keys: needs a Tentacle client).
A test that cannot hold on some release says so with
`@pytest.mark.ceph_releases("pacific", ..., reason="...")` and is skipped elsewhere with that reason.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import rados  # imported at run time inside the methods that use it, as before

SCRIPT = pathlib.Path(__file__).with_name("cluster.sh")
RELEASES_SCRIPT = pathlib.Path(__file__).with_name("releases.sh")
CLUSTER_ID = "test-cluster"
SESSION_RELEASES = ("pacific", "reef", "tentacle-legacy", "tentacle")
"""The values of --ceph-release: a release, and `-legacy` for Tentacle with aes keys."""


@dataclass
class CephTestCluster:
    directory: str
    conf: str
    mon_host: str
    pool: str
    user: str
    key: str
    admin_key: str
    cluster_id: str = CLUSTER_ID
    pool2: str = ""
    """A second RBD pool the csi user may use (for volumes journaled in `pool`, imaged here)."""
    release: str = "pacific"
    version: str = ""
    auth: str = "stock"
    key_type: str = "aes"
    """aes (`AQ...`) or aes256k (`Ag...`): the type of the admin and csi keys."""
    root: str = ""
    """The release root the daemons and the admin CLI run in ("" for the host's packages, "/" when
    the tests themselves run inside that root: tests/ceph/in_root.sh)."""

    @property
    def session_name(self) -> str:
        """The --ceph-release value naming this cluster's kind (e.g. "tentacle-legacy")."""
        return f"{self.release}-legacy" if self.auth == "legacy" else self.release

    @property
    def secrets(self) -> dict[str, str]:
        return {"userID": self.user, "userKey": self.key}

    @property
    def parameters(self) -> dict[str, str]:
        return {"clusterID": self.cluster_id, "pool": self.pool}

    def write_config(self, path: str | os.PathLike[str], cluster_id: str | None = None) -> str:
        """A ceph-csi style config.json naming this cluster."""
        doc = [{"clusterID": cluster_id or self.cluster_id, "monitors": [self.mon_host], "rbd": {"radosNamespace": ""}}]
        pathlib.Path(path).write_text(json.dumps(doc))
        return str(path)

    def cli(self, tool: str, *args: str) -> list[str]:
        """The argv of a ceph/rbd CLI command as client.admin, from the cluster's own release."""
        argv = [tool, "-c", self.conf, *args]
        return ["chroot", self.root, *argv] if self.root not in ("", "/") else argv

    def admin(self, *args: str, timeout: float = 60) -> str:
        """Run a ceph/rbd CLI command as client.admin (tests only)."""
        out = subprocess.run(self.cli(*args), check=True, capture_output=True, text=True, timeout=timeout)
        return out.stdout

    def images(self) -> list[str]:
        return sorted(json.loads(self.admin("rbd", "ls", "-p", self.pool, "--format", "json") or "[]"))

    def trash(self) -> list[dict[str, str]]:
        entries: list[dict[str, str]] = json.loads(self.admin("rbd", "trash", "ls", "-p", self.pool, "--format", "json") or "[]")
        return entries

    def _admin_ioctx(self) -> tuple[rados.Rados, rados.Ioctx]:
        import rados

        client = rados.Rados(rados_id="admin", conf={"mon_host": self.mon_host, "key": self.admin_key})
        client.connect(timeout=30)
        return client, client.open_ioctx(self.pool)

    def omap(self, obj: str) -> dict[str, str]:
        """The object's omap as admin sees it ({} when the object does not exist)."""
        client, io = self._admin_ioctx()
        try:
            return read_omap(io, obj)
        finally:
            io.close()
            client.shutdown()

    def objects(self) -> list[str]:
        client, io = self._admin_ioctx()
        try:
            return sorted(o.key for o in io.list_objects())
        finally:
            io.close()
            client.shutdown()

    def stop_mon(self) -> None:
        subprocess.run([str(SCRIPT), "stop-mon", self.directory], check=True, timeout=60)

    def start_mon(self) -> None:
        subprocess.run([str(SCRIPT), "start-mon", self.directory], check=True, timeout=60)

    def freeze(self) -> None:
        """Make every daemon stop answering (SIGSTOP); `thaw` resumes them with data intact."""
        subprocess.run([str(SCRIPT), "freeze", self.directory], check=True, timeout=60)

    def thaw(self) -> None:
        subprocess.run([str(SCRIPT), "thaw", self.directory], check=True, timeout=60)


def session_release(name: str) -> tuple[str, str]:
    """(release, auth) of a --ceph-release value."""
    if name not in SESSION_RELEASES:
        raise ValueError(f"unknown Ceph release {name!r} (one of {', '.join(SESSION_RELEASES)})")
    release, _, legacy = name.partition("-")
    return release, "legacy" if legacy else "stock"


def release_root(release: str) -> str:
    """The root holding `release`'s packages, debootstrapped the first time (~3-4 min), then cached.

    "/" when this process already runs inside that root (tests/ceph/in_root.sh sets
    CEPHCSI_IN_RELEASE_ROOT to the release): the daemons are then this system's own.
    """
    if os.environ.get("CEPHCSI_IN_RELEASE_ROOT") == release:
        return "/"
    out = subprocess.run([str(RELEASES_SCRIPT), "build", release], check=True, capture_output=True, text=True,
                         timeout=1800)
    return out.stdout.strip().splitlines()[-1]


def cached_release_root(release: str) -> str | None:
    """The root of `release` if it is built already, else None (nothing is built)."""
    if os.environ.get("CEPHCSI_IN_RELEASE_ROOT") == release:
        return "/"
    out = subprocess.run([str(RELEASES_SCRIPT), "path", release], capture_output=True, text=True, timeout=60,
                         check=False)
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None


def start_cluster(directory: str, release: str = "pacific", auth: str = "stock",
                  address: str | None = None) -> CephTestCluster:
    """A one-node cluster of `release` in `directory` (keep the path short: unix sockets), its
    daemons bound to `address` (default: $CEPH_ADDR, else the release's own loopback address).
    The address goes to the script's environment only, so clusters may start in parallel threads."""
    script_env = dict(os.environ)
    for name in ("CEPH_RELEASE", "CEPH_AUTH", "CEPH_ROOT"):
        script_env.pop(name, None)
    if address:
        script_env["CEPH_ADDR"] = address
    if release != "pacific":
        script_env.update(CEPH_RELEASE=release, CEPH_ROOT=release_root(release))
    if auth != "stock":
        script_env["CEPH_AUTH"] = auth
    env_path = subprocess.run(
        [str(SCRIPT), "start", directory], check=True, capture_output=True, text=True, timeout=300, env=script_env
    ).stdout.strip().splitlines()[-1]
    env: dict[str, str] = {}
    for line in pathlib.Path(env_path).read_text().splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    return CephTestCluster(
        directory=env["CEPH_DIR"],
        conf=env["CEPH_CONF"],
        mon_host=env["CEPH_MON_V2"],
        pool=env["CEPH_POOL"],
        user=env["CEPH_CSI_USER"],
        key=env["CEPH_CSI_KEY"],
        admin_key=env["CEPH_ADMIN_KEY"],
        pool2=env.get("CEPH_POOL2", ""),
        release=env.get("CEPH_RELEASE", "pacific"),
        version=env.get("CEPH_VERSION", ""),
        auth=env.get("CEPH_AUTH", "stock"),
        key_type=env.get("CEPH_KEY_TYPE", "aes"),
        root=env.get("CEPH_ROOT", ""),
    )


def stop_cluster(directory: str) -> None:
    subprocess.run([str(SCRIPT), "stop", directory], check=False, timeout=120)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--ceph-release", choices=SESSION_RELEASES, default=os.environ.get("CEPHCSI_CEPH_RELEASE", "pacific"),
        help="the Ceph release of the session's test cluster (default: pacific, the host's own; "
             "tentacle-legacy: Tentacle with aes keys, which the host's Pacific client can use)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ceph_releases(*names, reason): the test holds only on these --ceph-release values "
                   "(skipped, with the reason, on the others)")


def pytest_report_header(config: pytest.Config) -> str:
    return f"ceph test cluster: --ceph-release={config.getoption('--ceph-release')}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    current = str(config.getoption("--ceph-release"))
    for item in items:
        marker = item.get_closest_marker("ceph_releases")
        if marker is None:
            continue
        reason = marker.kwargs.get("reason")
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.ceph_releases needs a reason")
        unknown = set(marker.args) - set(SESSION_RELEASES)
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: unknown Ceph releases {sorted(unknown)}")
        if current not in marker.args:
            item.add_marker(pytest.mark.skip(reason=f"not on Ceph {current}: {reason}"))


@contextmanager
def running_cluster(prefix: str, release: str = "pacific", auth: str = "stock",
                    address: str | None = None) -> Iterator[CephTestCluster]:
    """A one-node cluster for the duration of the block, in a fresh folder under /tmp (a short
    path: unix socket names under it must stay below 107 bytes), bound to `address` if given;
    a failed start fails the test with the script's stderr, and the daemons are always stopped.
    The folder is kept with CEPHCSI_TEST_KEEP_CEPH set, for a post-mortem of the daemons' logs."""
    directory = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        try:
            cluster = start_cluster(directory, release=release, auth=auth, address=address)
        except subprocess.CalledProcessError as error:
            where = f" on {address}" if address else ""
            pytest.fail(f"could not start the Ceph {release} ({auth} auth) test cluster{where}: {error.stderr}")
        yield cluster
    finally:
        stop_cluster(directory)
        if not os.environ.get("CEPHCSI_TEST_KEEP_CEPH"):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def ceph_cluster(request: pytest.FixtureRequest) -> Iterator[CephTestCluster]:
    release, auth = session_release(str(request.config.getoption("--ceph-release")))
    with running_cluster("cc-", release, auth) as cluster:
        yield cluster


def read_omap(io: Any, obj: str) -> dict[str, str]:
    """An object's whole omap through an open ioctx ({} when the object does not exist)."""
    import rados

    with rados.ReadOpCtx() as op:
        items, _ = io.get_omap_vals(op, "", "", -1)
        try:
            io.operate_read_op(op, obj)
        except rados.ObjectNotFound:
            return {}
        return {k: v.decode() for k, v in items}
