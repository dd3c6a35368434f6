"""The delete path's header probe (cephcsi.ceph.dependents.HeaderProbe) against a real OSD and
real librbd watchers: it may only ever say "unused, no snapshots" when a read-only open would say
the same; every other case must fall back to the open (None)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator

import pytest
import rados
import rbd

from cephcsi.ceph import dependents
from tests.ceph.fixtures import CephTestCluster

pytestmark = [pytest.mark.integration, pytest.mark.ceph]


@pytest.fixture
def image(io: rados.Ioctx) -> Iterator[tuple[str, str]]:
    name = f"probe-{uuid.uuid4().hex[:12]}"
    rbd.RBD().create(io, name, 64 << 20, features=rbd.RBD_FEATURE_LAYERING)
    with rbd.Image(io, name, read_only=True) as opened:
        image_id = opened.id()
    yield name, image_id
    with rbd.Image(io, name) as opened:
        for snap in list(opened.list_snaps()):
            opened.remove_snap(snap["name"])
    rbd.RBD().remove(io, name)


def _open_elsewhere(ceph_cluster: CephTestCluster, name: str) -> subprocess.Popen[str]:
    """Another client (process) with the image open read-write: a watcher, as a mapped node is.
    It closes the image and exits when its stdin is closed."""
    script = textwrap.dedent(f"""
        import sys, rados, rbd
        client = rados.Rados(rados_id="admin", conf={{"mon_host": {ceph_cluster.mon_host!r}, "key": sys.stdin.readline().strip()}})
        client.connect()
        image = rbd.Image(client.open_ioctx({ceph_cluster.pool!r}), {name!r})
        print("open", flush=True)
        sys.stdin.readline()  # until the test closes our stdin
        image.close()
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(ceph_cluster.admin_key + "\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "open"
    return process


def test_an_unused_image_without_snapshots_needs_no_open(io: rados.Ioctx, image: tuple[str, str]) -> None:
    usage = dependents.HeaderProbe(io, image[1]).usage()
    assert usage is not None and usage.watchers == () and usage.snaps == []


def test_a_watched_image_falls_back_to_the_open(io: rados.Ioctx, image: tuple[str, str],
                                                ceph_cluster: CephTestCluster) -> None:
    name, image_id = image
    holder = _open_elsewhere(ceph_cluster, name)
    try:
        assert dependents.HeaderProbe(io, image_id).usage() is None
        # The open it falls back to sees the same watcher.
        opened = dependents.probe(io, name)
        assert opened is not None and len(opened.watchers) == 1
        # A client that no longer answers (killed, its watch not expired yet; here: stopped, so
        # that it can still close the image afterwards) makes the notify time out, which also
        # counts as watched.
        holder.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        assert dependents.HeaderProbe(io, image_id).usage() is None
        assert time.monotonic() - started < 5
    finally:
        holder.send_signal(signal.SIGCONT)
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


def test_an_image_with_a_snapshot_falls_back_to_the_open(io: rados.Ioctx, image: tuple[str, str]) -> None:
    name, image_id = image
    with rbd.Image(io, name) as opened:
        opened.create_snap("kept")
    assert dependents.HeaderProbe(io, image_id).usage() is None


def test_a_missing_header_falls_back_to_the_open(io: rados.Ioctx) -> None:
    assert dependents.HeaderProbe(io, "0123456789ab").usage() is None

