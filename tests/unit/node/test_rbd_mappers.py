"""Exact argv of the krbd and rbd-nbd mappers (they cannot run on the test machine)."""
from __future__ import annotations

import json
import os

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition, NotFound, PermissionDenied
from cephcsi.node.mappers.base import MapRequest
from cephcsi.node.mappers.krbd import KrbdMapper
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.stage_record import ImageSpec, StageRecord
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

KEY = "AQBNIjtnAAAAABAAxQZ3mZP9dMa2wfBEXAMPLE=="
CREDS = Credentials("csi", KEY)
IMAGE = ImageSpec("rbd", "csi-vol-1", "")
NS_IMAGE = ImageSpec("rbd", "csi-vol-2", "tenant")
VOLUME_ID = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"


def _request(image: ImageSpec = IMAGE, options: list[str] | None = None, read_only: bool = False) -> MapRequest:
    return MapRequest(VOLUME_ID, image, "10.0.0.1:6789,10.0.0.2:6789", CREDS, options or [], read_only)


def _record(image: ImageSpec, mapper: str, device: str = "", unmap_options: list[str] | None = None) -> StageRecord:
    return StageRecord(
        volume_id=VOLUME_ID, staging_path="/s", cluster_id="ceph", pool=image.pool, image=image.image,
        namespace=image.namespace, mapper=mapper, access_type="mount", device=device,
        unmap_options=unmap_options or [],
    )


def listing(device_type: str, pool: str, namespace: str, image: str, device: str) -> dict[str, object]:
    """One entry of `rbd device list --format json` as each tool prints it: krbd's (rbd's
    Kernel.cc) names the image "name", rbd-nbd's `list-mapped` (which the listing runs for nbd)
    names it "image", with the daemon's pid as id and an empty snap."""
    if device_type == "nbd":
        return {"id": 4242, "pool": pool, "namespace": namespace, "image": image, "snap": "", "device": device,
                "cookie": ""}
    return {"id": "0", "pool": pool, "namespace": namespace, "name": image, "snap": "-", "device": device}


class Cluster:
    """Answers `rbd device list/map/unmap` like a node where mapping works."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.mapped: list[dict[str, object]] = []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[:3] == ["rbd", "device", "list"]:
            return 0, json.dumps(self.mapped), ""
        if argv[:3] == ["rbd", "device", "map"]:
            pool = argv[argv.index("--pool") + 1]
            name = argv[argv.index("--image") + 1]
            namespace = argv[argv.index("--namespace") + 1] if "--namespace" in argv else ""
            device_type = argv[argv.index("--device-type") + 1]
            self.mapped.append(listing(device_type, pool, namespace, name, self.device))
            return 0, self.device + "\n", ""
        if argv[:3] == ["rbd", "device", "unmap"]:
            self.mapped = [m for m in self.mapped if m["device"] != argv[-1]]
            return 0, "", ""
        raise AssertionError(argv)


def _krbd(runner: FakeRunner, udev: bool = False) -> KrbdMapper:
    return KrbdMapper(runner, 30.0, lambda path, timeout: None, 5.0, lambda: udev)


def _nbd(runner: FakeRunner, log_dir: str = "") -> NbdMapper:
    return NbdMapper(runner, 30.0, lambda path, timeout: None, 5.0, log_dir=log_dir)


def _no_key_on_argv(runner: FakeRunner) -> None:
    for call in runner.calls:
        assert not any(KEY in arg for arg in call.argv), call.argv
        assert not any(arg in ("--key", "--secret") or arg.startswith(("--key=", "--secret=")) for arg in call.argv)


def test_krbd_map_argv_without_udev() -> None:
    runner = FakeRunner(Cluster("/dev/rbd0"))
    device = _krbd(runner).map(_request(options=["lock_on_read", "queue_depth=128"]))
    assert device == "/dev/rbd0"
    list_call, map_call = runner.calls
    assert list_call.argv == ["rbd", "device", "list", "--device-type", "krbd", "--format", "json"]
    keyfile = [a for a in map_call.argv if a.startswith("--keyfile=")][0].split("=", 1)[1]
    assert map_call.argv == [
        "rbd", "device", "map", "--device-type", "krbd",
        "--pool", "rbd", "--image", "csi-vol-1",
        "--id", "csi", "-m", "10.0.0.1:6789,10.0.0.2:6789", f"--keyfile={keyfile}",
        "--options", "noudev,lock_on_read,queue_depth=128",
    ]
    # The key reached rbd through a 0600 file holding just the key, removed afterwards.
    assert map_call.files[keyfile] == (0o600, KEY)
    assert not os.path.exists(keyfile)
    assert map_call.secrets == (KEY,)
    _no_key_on_argv(runner)


def test_krbd_map_with_udev_namespace_and_read_only() -> None:
    runner = FakeRunner(Cluster("/dev/rbd1"))
    _krbd(runner, udev=True).map(_request(NS_IMAGE, read_only=True))
    argv = runner.calls[1].argv
    assert argv[5:11] == ["--pool", "rbd", "--namespace", "tenant", "--image", "csi-vol-2"]
    assert argv[-1] == "--read-only"
    assert "--options" not in argv  # udev runs: no noudev, and no user options
    _no_key_on_argv(runner)


def test_krbd_map_is_idempotent() -> None:
    cluster = Cluster("/dev/rbd0")
    runner = FakeRunner(cluster)
    mapper = _krbd(runner)
    assert mapper.map(_request()) == "/dev/rbd0"
    assert mapper.map(_request()) == "/dev/rbd0"
    assert [c.argv[2] for c in runner.calls] == ["list", "map", "list"]


def test_krbd_unmap_argv_and_idempotence() -> None:
    cluster = Cluster("/dev/rbd0")
    runner = FakeRunner(cluster)
    mapper = _krbd(runner)
    mapper.map(_request())
    record = _record(IMAGE, "krbd", "/dev/rbd0", ["force"])
    mapper.unmap(record)
    assert runner.calls[-1].argv == ["rbd", "device", "unmap", "--device-type", "krbd", "--options", "noudev,force", "/dev/rbd0"]
    calls = len(runner.calls)
    mapper.unmap(record)  # nothing mapped any more: only a listing
    assert [c.argv[2] for c in runner.calls[calls:]] == ["list"]
    _no_key_on_argv(runner)


def test_krbd_unmap_checks_the_listing_not_the_record() -> None:
    """After a reboot /dev/rbd0 may belong to another volume: never unmap by the record alone."""
    cluster = Cluster("/dev/rbd0")
    cluster.mapped = [{"pool": "rbd", "namespace": "", "name": "someone-else", "snap": "-", "device": "/dev/rbd0"}]
    runner = FakeRunner(cluster)
    _krbd(runner).unmap(_record(IMAGE, "krbd", "/dev/rbd0"))
    assert [c.argv[2] for c in runner.calls] == ["list"]
    assert cluster.mapped[0]["name"] == "someone-else"


@pytest.mark.parametrize(
    "stderr, error, text",
    [
        ("rbd: failed to load rbd kernel module (127)\nrbd: map failed: (2) No such file or directory", FailedPrecondition, "another mounter"),
        ("rbd: error opening image csi-vol-1: (2) No such file or directory", NotFound, "does not exist"),
        ("rbd: map failed: (13) Permission denied", PermissionDenied, "refused"),
    ],
)
def test_krbd_map_errors(stderr: str, error: type, text: str) -> None:
    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[2] == "list":
            return 0, "[]", ""
        return 1, "", stderr

    runner = FakeRunner(respond)
    with pytest.raises(error, match=text):
        _krbd(runner).map(_request())


def test_nbd_map_argv(tmp_path: os.PathLike[str]) -> None:
    runner = FakeRunner(Cluster("/dev/nbd0"))
    device = _nbd(runner, log_dir=str(tmp_path)).map(_request(options=["io-timeout=30", "reattach-timeout=60"]))
    assert device == "/dev/nbd0"
    assert runner.calls[0].argv == ["rbd", "device", "list", "--device-type", "nbd", "--format", "json"]
    argv = runner.calls[1].argv
    keyfile = [a for a in argv if a.startswith("--keyfile=")][0].split("=", 1)[1]
    log_arg = [a for a in argv if a.startswith("--log-file=")][0]
    assert log_arg.startswith(f"--log-file={tmp_path}/rbd-nbd-") and log_arg.endswith(".log")
    assert argv == [
        "rbd", "device", "map", "--device-type", "nbd",
        "--pool", "rbd", "--image", "csi-vol-1",
        "--id", "csi", "-m", "10.0.0.1:6789,10.0.0.2:6789", f"--keyfile={keyfile}", log_arg,
        "--options", "io-timeout=30,reattach-timeout=60",
    ]
    assert runner.calls[1].files[keyfile] == (0o600, KEY)
    _no_key_on_argv(runner)


def test_nbd_unmap_argv() -> None:
    cluster = Cluster("/dev/nbd3")
    runner = FakeRunner(cluster)
    mapper = _nbd(runner)
    mapper.map(_request(NS_IMAGE))
    mapper.unmap(_record(NS_IMAGE, "rbd-nbd", "/dev/nbd3"))
    assert runner.calls[-1].argv == ["rbd", "device", "unmap", "--device-type", "nbd", "/dev/nbd3"]
    _no_key_on_argv(runner)


def test_nbd_without_module() -> None:
    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[2] == "list":
            return 0, "[]", ""
        return 1, "", "rbd-nbd: failed to find unused device\nrbd: rbd-nbd failed with error: /usr/bin/rbd-nbd: exit status: 1"

    with pytest.raises(FailedPrecondition, match="cannot create the device"):
        _nbd(FakeRunner(respond)).map(_request())


# What `rbd device map` prints on a node without /etc/ceph/ceph.conf (captured from Pacific's
# rbd CLI; Reef prints the same lines), with the real cause last.
CONF_NOISE = (
    "did not load config file, using default settings.\n"
    "2026-11-23T10:53:18.865+0000 7f41aa1e9380 -1 Errors while parsing config file!\n\n"
    "2026-11-23T10:53:18.865+0000 7f41aa1e9380 -1 can't open ceph.conf: (2) No such file or directory\n\n"
    "2026-11-23T10:53:18.865+0000 7f41aa1e9380 -1 Errors while parsing config file!\n\n"
    "2026-11-23T10:53:18.865+0000 7f41aa1e9380 -1 can't open ceph.conf: (2) No such file or directory\n\n"
)


def test_ceph_conf_noise_is_left_out_of_error_messages() -> None:
    from cephcsi.errors import Internal

    cause = "rbd: sysfs write failed\nrbd: map failed: (22) Invalid argument"

    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[2] == "list":
            return 0, "[]", CONF_NOISE
        return 22, "", CONF_NOISE + cause

    with pytest.raises(Internal) as raised:
        _krbd(FakeRunner(respond)).map(_request())
    message = raised.value.message
    assert "ceph.conf" not in message and "config file" not in message, message
    assert message.endswith("rbd: sysfs write failed rbd: map failed: (22) Invalid argument"), message
    assert "`rbd device map" in message and "exited 22" in message


def test_ceph_conf_noise_does_not_turn_errors_into_not_found() -> None:
    # "can't open ceph.conf: (2) ..." must not count as ENOENT for the image.
    def respond(argv: list[str]) -> tuple[int, str, str]:
        if argv[2] == "list":
            return 0, "[]", ""
        return 1, "", CONF_NOISE + "rbd: map failed: (13) Permission denied"

    with pytest.raises(PermissionDenied, match=r"caps: .*: rbd: map failed: \(13\) Permission denied$"):
        _krbd(FakeRunner(respond)).map(_request())


def test_a_failed_device_list_quotes_the_cause_without_noise() -> None:
    from cephcsi.errors import Internal

    runner = FakeRunner(lambda argv: (1, "", CONF_NOISE + "rbd: unknown device type"))
    with pytest.raises(Internal, match=r"exited 1: rbd: unknown device type$"):
        _krbd(runner).map(_request())
