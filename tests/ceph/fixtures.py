"""pytest fixtures for the real one-node Ceph cluster started by tests/ceph/cluster.sh."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import rados  # imported at run time inside the methods that use it, as before

SCRIPT = pathlib.Path(__file__).with_name("cluster.sh")
CLUSTER_ID = "test-cluster"


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

    def admin(self, *args: str, timeout: float = 60) -> str:
        """Run a ceph/rbd CLI command as client.admin (tests only)."""
        tool, rest = args[0], args[1:]
        out = subprocess.run(
            [tool, "-c", self.conf, *rest], check=True, capture_output=True, text=True, timeout=timeout
        )
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
        import rados

        client, io = self._admin_ioctx()
        try:
            with rados.ReadOpCtx() as op:
                items, _ = io.get_omap_vals(op, "", "", -1)
                try:
                    io.operate_read_op(op, obj)
                except rados.ObjectNotFound:
                    return {}
                return {k: v.decode() for k, v in items}
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


def start_cluster(directory: str) -> CephTestCluster:
    env_path = subprocess.run(
        [str(SCRIPT), "start", directory], check=True, capture_output=True, text=True, timeout=300
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
    )


def stop_cluster(directory: str) -> None:
    subprocess.run([str(SCRIPT), "stop", directory], check=False, timeout=120)


@pytest.fixture(scope="session")
def ceph_cluster() -> Iterator[CephTestCluster]:
    # Short path: unix socket names under it must stay below 107 bytes.
    directory = tempfile.mkdtemp(prefix="cc-", dir="/tmp")
    try:
        cluster = start_cluster(directory)
    except subprocess.CalledProcessError as error:
        stop_cluster(directory)
        pytest.fail(f"could not start the Ceph test cluster: {error.stderr}")
    try:
        yield cluster
    finally:
        stop_cluster(directory)
        if not os.environ.get("CEPHCSI_TEST_KEEP_CEPH"):  # kept for a post-mortem of its daemons' logs
            shutil.rmtree(directory, ignore_errors=True)
