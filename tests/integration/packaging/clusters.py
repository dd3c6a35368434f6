"""The Ceph clusters the image is run against, by --ceph-release name (tests/ceph/fixtures.py):
the host's Pacific 16.2.15, Reef 18.2.7, and Tentacle 20.2.4 with its stock auth (aes256k keys
only, which no client older than Tentacle can parse)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.ceph import fixtures
from tests.ceph.fixtures import CephTestCluster

RELEASES = ("pacific", "reef", "tentacle")


@contextmanager
def started(name: str) -> Iterator[CephTestCluster]:
    """A one-node cluster of the --ceph-release value `name` for the duration of the block."""
    release, auth = fixtures.session_release(name)
    with fixtures.running_cluster(f"ci-{release[:4]}-", release, auth) as cluster:
        yield cluster
