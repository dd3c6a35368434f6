"""rbd-nbd re-attach after a plugin restart (cephcsi.node.nbd_healer) and the `exclusive` map option
(cephcsi.node.mappers.exclusive): argv, the kept record, and each state a device can be found in.
The real kernel behaviour is tested in tests/vm/test_nbd_reattach.py and test_exclusive_map.py."""
from __future__ import annotations

import json
import logging
import os
import pathlib

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition, PermissionDenied
from cephcsi.locks import KeyLocks
from cephcsi.node.mappers.base import MapRequest
from cephcsi.node.mappers.krbd import KrbdMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mappers.nbd_attachments import AttachmentStore
from cephcsi.node.nbd_healer import NbdHealer
from cephcsi.node.stage_record import ImageSpec, StageRecord
from tests.unit.node.fakes import FakeRunner
from tests.unit.node.test_rbd_mappers import listing

pytestmark = pytest.mark.unit

KEY = "AQBNIjtnAAAAABAAxQZ3mZP9dMa2wfBEXAMPLE=="
IMAGE = ImageSpec("rbd", "csi-vol-1", "")
VOLUME_ID = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"
COOKIE = "4f845c73-67f5-4bf2-bbe6-e17a98e7da63"


class Node:
    """`rbd device list/map/attach/unmap/info` and /sys/block of a node with the nbd driver: a
    netlink map leaves a backend cookie in sysfs; `kill` is what a container restart does."""

    def __init__(self, sys_block: pathlib.Path, features: tuple[str, ...] = ("layering", "exclusive-lock")) -> None:
        self.sys_block = sys_block
        self.features = features
        self.served: dict[str, str] = {}  # device → image
        self.attach_error = ""

    def bind(self, device: str, cookie: str) -> None:
        path = self.sys_block / os.path.basename(device)
        path.mkdir(parents=True, exist_ok=True)
        (path / "backend").write_text(cookie + "\n")

    def release(self, device: str) -> None:
        (self.sys_block / os.path.basename(device) / "backend").unlink(missing_ok=True)

    def kill(self) -> None:
        self.served.clear()

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["rbd", "device", "list"]:
            return 0, json.dumps([listing("nbd", "rbd", "", image, device) for device, image in self.served.items()]), ""
        if argv[:2] == ["rbd", "info"]:
            return 0, json.dumps({"name": IMAGE.image, "features": list(self.features)}), ""
        image = argv[argv.index("--image") + 1] if "--image" in argv else ""
        if argv[:3] == ["rbd", "device", "map"]:
            self.served["/dev/nbd0"] = image
            options = argv[argv.index("--options") + 1] if "--options" in argv else ""
            if "try-netlink" in options:
                self.bind("/dev/nbd0", COOKIE)
            return 0, "/dev/nbd0\n", ""
        if argv[:3] == ["rbd", "device", "attach"]:
            if self.attach_error:
                return 1, "", self.attach_error
            self.served[argv[argv.index("--device") + 1]] = image
            return 0, "", ""
        if argv[:3] == ["rbd", "device", "unmap"]:
            self.served.pop(argv[-1], None)
            self.release(argv[-1])
            return 0, "", ""
        raise AssertionError(argv)


def _request(options: list[str], read_only: bool = False, exclusive: bool = True) -> MapRequest:
    return MapRequest(VOLUME_ID, IMAGE, "10.0.0.1:6789", Credentials("csi", KEY), options, read_only,
                      exclusive=exclusive)


def _record() -> StageRecord:
    return StageRecord(volume_id=VOLUME_ID, staging_path="/s", cluster_id="ceph", pool="rbd", image=IMAGE.image,
                       namespace="", mapper="rbd-nbd", access_type="mount", device="/dev/nbd0")


def _mapper(runner: FakeRunner, tmp_path: pathlib.Path) -> NbdMapper:
    return NbdMapper(runner, 30.0, lambda path, timeout: None, 5.0, attachments=AttachmentStore(str(tmp_path / "state")),
                     sys_block=str(tmp_path / "sys"))


def _no_key_on_argv(runner: FakeRunner) -> None:
    for call in runner.calls:
        assert not any(KEY in arg for arg in call.argv), call.argv


def test_netlink_map_keeps_a_root_only_record_and_unmap_removes_it(tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink"]))
    store = mapper.attachments
    path = store.path(VOLUME_ID)
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(store.root).st_mode & 0o777 == 0o700
    kept = store.load(VOLUME_ID)
    assert kept is not None and kept.device == "/dev/nbd0" and kept.cookie == COOKIE and kept.key == KEY
    assert kept.options == ["reattach-timeout=300", "try-netlink", "exclusive"]
    assert KEY not in repr(kept)
    mapper.unmap(_record())
    assert store.load(VOLUME_ID) is None and not os.path.exists(path)
    _no_key_on_argv(runner)


def test_ioctl_map_keeps_no_key(tmp_path: pathlib.Path) -> None:
    runner = FakeRunner(Node(tmp_path / "sys"))
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request([]))
    assert mapper.attachments.all() == []


def test_healer_reattaches_a_waiting_device_with_its_cookie_and_options(tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink", "io-timeout=30"]))
    node.kill()  # the container restarted: no daemon, the kernel still holds nbd0 with our cookie
    report = NbdHealer(_mapper(runner, tmp_path), KeyLocks("volume")).heal()
    assert report.reattached == [VOLUME_ID] and not report.lost and not report.failed
    attach = [c for c in runner.calls if c.argv[:3] == ["rbd", "device", "attach"]][0]
    keyfile = [a for a in attach.argv if a.startswith("--keyfile=")][0].split("=", 1)[1]
    assert attach.argv == [
        "rbd", "device", "attach", "--device-type", "nbd", "--device", "/dev/nbd0", "--cookie", COOKIE,
        "--pool", "rbd", "--image", "csi-vol-1", "--id", "csi", "-m", "10.0.0.1:6789", f"--keyfile={keyfile}",
        "--options", "reattach-timeout=300,try-netlink,io-timeout=30,exclusive",
    ]
    assert attach.files[keyfile] == (0o600, KEY) and not os.path.exists(keyfile)
    assert node.served == {"/dev/nbd0": IMAGE.image}
    _no_key_on_argv(runner)
    # A second pass finds it served: nothing to do.
    again = NbdHealer(mapper, KeyLocks("volume")).heal()
    assert again.serving == [VOLUME_ID] and not again.reattached


def test_healer_reports_a_device_gone_and_forgets_it(tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink"]))
    node.kill()
    node.release("/dev/nbd0")  # disconnected in the kernel while no plugin ran
    with caplog.at_level(logging.ERROR):
        report = NbdHealer(mapper, KeyLocks("volume")).heal()
    assert report.lost == [VOLUME_ID]
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "restart the pods" in error.getMessage() and getattr(error, "fields")["volume_id"] == VOLUME_ID
    assert KEY not in caplog.text
    assert not any(c.argv[:3] == ["rbd", "device", "attach"] for c in runner.calls)
    assert mapper.attachments.all() == []


def test_healer_never_attaches_to_a_device_now_bound_for_another_mapping(tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink"]))
    node.kill()
    node.bind("/dev/nbd0", "another-cookie")
    report = NbdHealer(mapper, KeyLocks("volume")).heal()
    assert report.lost == [VOLUME_ID]
    assert not any(c.argv[:3] == ["rbd", "device", "attach"] for c in runner.calls)


def test_failed_reattach_is_logged_and_kept_for_the_next_start(tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink"]))
    node.kill()
    node.attach_error = "rbd: map failed: (13) Permission denied"
    assert mapper.reattach_pending(VOLUME_ID)  # a NodeStage waits for the healer...
    report = NbdHealer(mapper, KeyLocks("volume")).heal()
    assert report.failed == [VOLUME_ID]
    kept = mapper.attachments.load(VOLUME_ID)
    assert kept is not None and kept.reattach_failed  # kept: unstage disconnects it, a restart retries
    assert not mapper.reattach_pending(VOLUME_ID)  # ...but not after it failed: the stage starts over
    node.attach_error = ""
    assert NbdHealer(mapper, KeyLocks("volume")).heal().reattached == [VOLUME_ID]


def test_unmap_disconnects_a_device_still_waiting_for_its_daemon(tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink"]))
    node.kill()
    mapper.unmap(_record())
    assert runner.calls[-1].argv == ["rbd", "device", "unmap", "--device-type", "nbd", "/dev/nbd0"]
    assert mapper.attachments.all() == [] and not (tmp_path / "sys" / "nbd0" / "backend").exists()


def test_healer_waits_for_a_volume_busy_in_another_call(tmp_path: pathlib.Path) -> None:
    node = Node(tmp_path / "sys")
    runner = FakeRunner(node)
    mapper = _mapper(runner, tmp_path)
    mapper.map(_request(["try-netlink"]))
    node.kill()
    locks = KeyLocks("volume")
    with locks.hold(VOLUME_ID):
        report = NbdHealer(mapper, locks, lock_wait=0.3).heal()
    assert report.failed == [VOLUME_ID] and node.served == {}


# -- exclusive ---------------------------------------------------------------------------------


def _map_options(runner: FakeRunner) -> str:
    argv = [c.argv for c in runner.calls if c.argv[:3] == ["rbd", "device", "map"]][0]
    return argv[argv.index("--options") + 1] if "--options" in argv else ""


def test_nbd_read_write_map_of_an_image_with_exclusive_lock_is_exclusive(tmp_path: pathlib.Path) -> None:
    runner = FakeRunner(Node(tmp_path / "sys"))
    _mapper(runner, tmp_path).map(_request([]))
    info = [c for c in runner.calls if c.argv[:2] == ["rbd", "info"]][0]
    assert "--format" in info.argv and info.secrets == (KEY,)
    assert _map_options(runner) == "reattach-timeout=300,exclusive"
    _no_key_on_argv(runner)


@pytest.mark.parametrize("read_only, exclusive, features, user, expected", [
    (True, True, ("layering", "exclusive-lock"), [], "reattach-timeout=300"),  # readers never lock
    (False, False, ("layering", "exclusive-lock"), [], "reattach-timeout=300"),  # not a single-node writer
    (False, True, ("layering",), [], "reattach-timeout=300"),  # no lock to take
    (False, True, ("layering",), ["exclusive"], "reattach-timeout=300,exclusive"),  # the user's choice, as written
])
def test_nbd_exclusive_only_where_it_applies(tmp_path: pathlib.Path, read_only: bool, exclusive: bool,
                                             features: tuple[str, ...], user: list[str], expected: str) -> None:
    runner = FakeRunner(Node(tmp_path / "sys", features))
    _mapper(runner, tmp_path).map(_request(user, read_only=read_only, exclusive=exclusive))
    assert _map_options(runner) == expected
    if read_only or not exclusive or user:
        assert not any(c.argv[:2] == ["rbd", "info"] for c in runner.calls)  # no extra round trip


def test_krbd_is_not_exclusive_by_default_but_takes_it_from_map_options(tmp_path: pathlib.Path) -> None:
    """krbd `exclusive` makes `rbd resize`/`snap create` of the mapped image fail (EROFS, Linux 6.1)."""
    node = Node(tmp_path / "sys")

    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["rbd", "device", "map"]:
            return 0, "/dev/rbd0\n", ""
        return node(argv)

    runner = FakeRunner(respond)
    krbd = KrbdMapper(runner, 30.0, lambda p, t: None, 5.0, lambda: True)
    krbd.map(_request([]))
    assert _map_options(runner) == "" and not any(c.argv[:2] == ["rbd", "info"] for c in runner.calls)
    runner.calls.clear()
    krbd.map(_request(["exclusive"]))
    assert _map_options(runner) == "exclusive"


def test_image_features_error_is_translated(tmp_path: pathlib.Path) -> None:
    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["rbd", "device", "list"]:
            return 0, "[]", ""
        return 1, "", "rbd: error opening image csi-vol-1: (13) Permission denied"

    with pytest.raises(PermissionDenied):
        _mapper(FakeRunner(respond), tmp_path).map(_request([]))


def test_map_refused_by_the_lock_holder_names_the_way_out(tmp_path: pathlib.Path) -> None:
    """What rbd-nbd --exclusive printed on Linux 6.1 while another client held the lock (tests/vm)."""
    stderr = ("rbd-nbd: failed to acquire exclusive lock: (30) Read-only file system\n"
              "librbd: failed to request exclusive lock: (30) Read-only file system\n"
              "rbd: rbd-nbd failed with error: /usr/bin/rbd-nbd: exit status: 1")

    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["rbd", "device", "list"]:
            return 0, "[]", ""
        if argv[:2] == ["rbd", "info"]:
            return 0, json.dumps({"features": ["layering", "exclusive-lock"]}), ""
        return 1, "", stderr

    with pytest.raises(FailedPrecondition, match="holds the exclusive lock.*rbd lock ls"):
        _mapper(FakeRunner(respond), tmp_path).map(_request([]))
