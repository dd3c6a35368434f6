"""The volume's cluster lock's reading of `rados lock info` with a fake runner: a lock object
that does not exist has no lockers, any other failure is an error — never "no lockers", which
would make release() leave the lock held without a word. The real tool runs in
tests/integration/node/test_volume_lock.py."""
from __future__ import annotations

import json

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import CephCSIError
from cephcsi.node.stage_record import ImageSpec
from cephcsi.node.volume_lock import ClusterLock
from tests.unit.node.fakes import FakeRunner, Responder

pytestmark = pytest.mark.unit

KEY = "AQDNxw5nAAAAABAAm5iF0VdkmIsjJm9H4BXRBQ=="
VOLUME = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"
COOKIE = "cephcsi-format@node-a/1"


def lock(respond: Responder) -> tuple[ClusterLock, FakeRunner]:
    runner = FakeRunner(respond)
    return ClusterLock(runner, 10, ImageSpec("rbd", "csi-vol-1"), "127.0.0.1:6789", Credentials("csi", KEY), VOLUME,
                       COOKIE, "test"), runner


CONF = ("did not load config file, using default settings.\n"
        "2026-11-27T20:47:50.720+0000 7f87 -1 can't open ceph.conf: (2) No such file or directory\n")
"""What every run without a ceph.conf prints first (Ceph 19's rados, as the test cluster runs it)."""


@pytest.mark.parametrize("stderr", [
    CONF + "ERROR: rados_lock_get_lock_info(): (2) No such file or directory\nerror 2: (2) No such file or directory\n",
    "ERROR: rados_lock_get_lock_info(): No such file or directory\n",  # older rados: strerror_r, no number
])
def test_a_lock_object_that_does_not_exist_has_no_lockers(stderr: str) -> None:
    held, _ = lock(lambda argv: (1, "", stderr))
    assert held.lockers() == []


def test_lockers_are_read_from_the_json() -> None:
    doc = {"name": f"{VOLUME}-mutexlock", "type": "exclusive",
           "lockers": [{"name": "client.4242", "cookie": COOKIE, "description": "x", "expiration": "e", "addr": "a"}]}
    held, _ = lock(lambda argv: (0, json.dumps(doc), ""))
    assert [(locker["name"], locker["cookie"]) for locker in held.lockers()] == [("client.4242", COOKIE)]


@pytest.mark.parametrize("stderr", [
    CONF + "ERROR: rados_lock_get_lock_info(): (13) Permission denied\nerror 13: (13) Permission denied\n",
    CONF + "2026-11-27T20:00:00.000+0000 7f00 -1 monclient(hunting): authenticate timed out after 300\n"
    "failed to fetch mon config (--no-mon-config to skip)\n",
    CONF + "error opening pool rbd: (2) No such file or directory\n",  # ENOENT, but not of the lock's object
])
def test_any_other_failure_raises_and_release_is_not_silent(stderr: str) -> None:
    held, runner = lock(lambda argv: (1, "", stderr))
    with pytest.raises(CephCSIError, match=f"read the lock of volume {VOLUME}"):
        held.lockers()
    with pytest.raises(CephCSIError):
        held.release()
    assert not any("break" in call.argv for call in runner.calls)
