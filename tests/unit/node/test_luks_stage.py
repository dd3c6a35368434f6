"""The stager's LUKS steps with fakes for the mapper, mounts and commands (the real ones run on
the VM node, tests/vm/test_encrypted_stage.py): ceph-csi's state protocol (format only from
"encryptionPrepared" and a blank device, then "encrypted"; open without formatting otherwise;
refuse anything else), the mapping named in the record before it is opened, a resumed stage
with an open mapping needing no passphrase, and unstage/rollback closing it before the unmap."""
from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.encryption.spec import EncryptionSpec
from cephcsi.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument, OperationInFlight
from cephcsi.node import stage_record
from cephcsi.node.mappers.base import KRBD, MapRequest
from cephcsi.node.mounts import MountEntry
from cephcsi.node.requests import StageRequest, VolumeAccess
from cephcsi.node.stage_record import ImageSpec, StageRecord
from cephcsi.node.stager import Stager
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOLUME = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"
NAME = f"luks-rbd-{VOLUME}"
PASSPHRASE = "secret-passphrase-of-the-class"
KEY = "AQDNxw5nAAAAABAAm5iF0VdkmIsjJm9H4BXRBQ=="
STATE = "rbd.csi.ceph.com/encrypted"
ACTIVE = f"/dev/mapper/{NAME} is active.\n  type:    LUKS2\n  device:  {{device}}\n  offset:  32768 sectors\n" \
         "  size:    98304 sectors\n"


class Events:
    def __init__(self) -> None:
        self.log: list[str] = []


class FakeMapper:
    name = KRBD

    def __init__(self, device: str, events: Events) -> None:
        self.device = device
        self.events = events
        self.mapped = False

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        return ""

    def map(self, request: MapRequest) -> str:
        self.mapped = True
        self.events.log.append("map")
        return self.device

    def find(self, record: StageRecord) -> str | None:
        return self.device if self.mapped else None

    def unmap(self, record: StageRecord) -> None:
        self.mapped = False
        self.events.log.append("unmap")


class FakeMounter:
    def __init__(self, events: Events) -> None:
        self.events = events

    def bind(self, source: str, target: str, read_only: bool = False) -> None:
        self.events.log.append(f"bind {source}")

    def unmount(self, target: str) -> None:
        self.events.log.append("unmount")


class FixedChoice:
    def for_volume(self, mounter: str) -> str:
        return KRBD


class Cluster:
    """The image's metadata and the dm-crypt mapping, as the fake commands change them."""

    def __init__(self, device: str, events: Events, state: str | None, blkid: str = "", is_luks: bool = False) -> None:
        self.device = device
        self.events = events
        self.metadata = {} if state is None else {STATE: state}
        self.blkid = blkid
        self.is_luks = is_luks
        self.open = False
        # The volume's cls_lock: its holder's cookie, and what "another node" does while it holds it.
        self.holder: str | None = None
        self.busy: list[str] = []
        self.other_finishes: Callable[[], None] | None = None

    def _lock(self, argv: list[str]) -> tuple[int, str, str]:
        op = argv[argv.index("lock") + 1]
        assert argv[argv.index("lock") + 3] == f"{VOLUME}-mutexlock"
        if op == "get":
            cookie = argv[argv.index("--lock-cookie") + 1]
            if self.holder is not None:
                self.busy.append(cookie)
                self.events.log.append("lock busy")
                if self.other_finishes is not None:
                    self.other_finishes()
                return 1, "", "rados: lock get failed: (16) Device or resource busy"
            self.holder = cookie
            self.events.log.append("lock get")
            return 0, "", ""
        if op == "info":
            if self.holder is None:
                return 1, "", "ERROR: rados_lock_get_lock_info(): (2) No such file or directory"
            return 0, json.dumps({"name": f"{VOLUME}-mutexlock", "type": "exclusive", "lockers": [
                {"name": "client.4242", "cookie": self.holder, "description": "", "expiration": "x", "addr": "y"}]}), ""
        assert op == "break" and argv[argv.index("--lock-cookie") + 1] == self.holder
        self.holder = None
        self.events.log.append("lock break")
        return 0, "", ""

    def respond(self, argv: list[str]) -> tuple[int, str, str] | None:
        if argv[0] == "rados" and "lock" in argv:
            return self._lock(argv)
        if argv[:3] == ["rbd", "image-meta", "list"]:
            self.events.log.append("meta list")
            return 0, json.dumps(self.metadata), ""
        if argv[:3] == ["rbd", "image-meta", "set"]:
            self.metadata[argv[-2]] = argv[-1]
            self.events.log.append(f"meta set {argv[-1]}")
            return None
        if argv[0] == "blkid":
            return (0, self.blkid, "") if self.blkid else (2, "", "")
        if argv[0] != "cryptsetup":
            return None
        action = argv[2] if argv[1] == "-q" else argv[1]
        if action == "status":
            return (0, ACTIVE.format(device=self.device), "") if self.open else (4, "", "")
        if action == "isLuks":
            return (0 if self.is_luks else 1), "", ""
        self.events.log.append(action)
        if action == "luksFormat":
            self.is_luks = True
        elif action == "luksOpen":
            self.open = True
        elif action == "luksClose":
            self.open = False
        return None


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def device(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "rbd0")
    with open(path, "wb") as handle:
        handle.truncate(1 << 20)
    return path


def make(cluster: Cluster, events: Events, mapper: FakeMapper) -> tuple[Stager, FakeRunner]:
    runner = FakeRunner(cluster.respond)
    stager = Stager({KRBD: mapper}, FixedChoice(), FakeMounter(events), runner, 10, "",  # type: ignore[arg-type]
                    read_mounts=lambda: [])
    return stager, runner


def request(staging: str, kind: str = "block") -> StageRequest:
    return StageRequest(
        volume_id=VOLUME, staging_path=staging, cluster_id="ceph", monitors="127.0.0.1:6789",
        image=ImageSpec("rbd", "csi-vol-1"), credentials=Credentials("csi", KEY), access=VolumeAccess("block"),
        encryption=EncryptionSpec(type=kind, kms_id="default"),
        secrets={"userID": "csi", "userKey": KEY, "encryptionPassphrase": PASSPHRASE},
    )


def staging_dir(tmp_path: os.PathLike[str]) -> str:
    path = os.path.join(tmp_path, "staging")
    os.mkdir(path)
    return path


def test_first_stage_formats_marks_and_opens_and_binds_the_mapping(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encryptionPrepared")
    stager, runner = make(cluster, events, FakeMapper(device, events))
    staging = staging_dir(tmp_path)
    stager.stage(request(staging))
    # Under the volume's cluster lock: the state read again, the format, the new state; then released.
    assert events.log == ["map", "meta list", "lock get", "meta list", "luksFormat", "meta set encrypted",
                          "lock break", "luksOpen", f"bind /dev/mapper/{NAME}"]
    assert cluster.holder is None
    assert cluster.metadata[STATE] == "encrypted"
    record = stage_record.load(staging)
    assert record is not None and record.staged and record.crypt_name == NAME and record.encryption == "block"
    # The passphrase went to cryptsetup's stdin only.
    assert [c.stdin for c in runner.calls if c.argv[0] == "cryptsetup" and c.stdin] == [PASSPHRASE, PASSPHRASE]
    assert not any(PASSPHRASE in arg for c in runner.calls for arg in c.argv)


def test_an_encrypted_volume_is_opened_never_formatted(tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encrypted", blkid="TYPE=crypto_LUKS\nUSAGE=crypto\n", is_luks=True)
    stager, _ = make(cluster, events, FakeMapper(device, events))
    stager.stage(request(staging_dir(tmp_path)))
    assert "luksFormat" not in events.log and "luksOpen" in events.log
    assert "lock get" not in events.log  # opening an encrypted volume takes no lock


def test_a_header_an_interrupted_stage_wrote_is_kept_and_the_state_finished(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encryptionPrepared", blkid="TYPE=crypto_LUKS\nUSAGE=crypto\n", is_luks=True)
    stager, _ = make(cluster, events, FakeMapper(device, events))
    stager.stage(request(staging_dir(tmp_path)))
    assert "luksFormat" not in events.log
    assert cluster.metadata[STATE] == "encrypted"


@pytest.mark.parametrize("state, blkid", [("encrypted", ""), (None, ""), ("encryptionPrepared", "TYPE=ext4\nUSAGE=filesystem\n")])
def test_nothing_is_formatted_outside_the_protocol_and_the_map_is_rolled_back(
        tmp_path: os.PathLike[str], device: str, events: Events, state: str | None, blkid: str) -> None:
    cluster = Cluster(device, events, state, blkid=blkid)
    mapper = FakeMapper(device, events)
    stager, _ = make(cluster, events, mapper)
    with pytest.raises(FailedPrecondition):
        stager.stage(request(staging_dir(tmp_path)))
    assert "luksFormat" not in events.log and "luksOpen" not in events.log
    assert not mapper.mapped
    assert cluster.metadata == ({} if state is None else {STATE: state})


def test_a_resumed_stage_with_the_mapping_open_needs_no_passphrase(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encrypted", is_luks=True)
    mapper = FakeMapper(device, events)
    stager, _ = make(cluster, events, mapper)
    staging = staging_dir(tmp_path)
    stager.stage(request(staging))
    record = stage_record.load(staging)
    assert record is not None
    record.staged = False  # as if the plugin died before the last save
    stage_record.save(record)
    events.log.clear()
    stager.stage(request(staging))
    assert "meta list" not in events.log and "luksOpen" not in events.log


def test_unstage_closes_the_mapping_between_unmount_and_unmap(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encryptionPrepared")
    stager, _ = make(cluster, events, FakeMapper(device, events))
    staging = staging_dir(tmp_path)
    stager.stage(request(staging))
    events.log.clear()
    stager.unstage(VOLUME, staging)
    assert events.log == ["luksClose", "unmap"]
    assert not cluster.open and stage_record.load(staging) is None


def test_file_encryption_of_a_block_volume_is_refused_before_anything_is_done(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encryptionPrepared")
    stager, runner = make(cluster, events, FakeMapper(device, events))
    with pytest.raises(InvalidArgument) as caught:
        stager.stage(request(staging_dir(tmp_path), kind="file"))
    assert 'encryptionType "file"' in caught.value.message and "Block volume" in caught.value.message
    assert runner.calls == [] and events.log == []


def test_unstage_without_a_record_closes_the_mapping_it_finds_mounted(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encrypted", is_luks=True)
    cluster.open = True
    staging = staging_dir(tmp_path)
    os.mkdir(os.path.join(staging, "fs"))
    entry = MountEntry(90, 1, 253, 0, "/", os.path.join(staging, "fs"), ("rw",), "ext4", f"/dev/mapper/{NAME}", ())
    mounted = [entry]
    runner = FakeRunner(cluster.respond)

    class Unmounter(FakeMounter):
        def unmount(self, target: str) -> None:
            mounted.clear()
            super().unmount(target)

    stager = Stager({KRBD: FakeMapper(device, events)}, FixedChoice(), Unmounter(events), runner, 10, "",  # type: ignore[arg-type]
                    read_mounts=lambda: list(mounted))
    stager.unstage(VOLUME, staging)
    assert events.log == ["unmount", "luksClose"]
    assert not cluster.open


def test_a_format_by_another_node_is_waited_for_and_its_header_opened(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    """Two nodes staging one prepared volume: this one finds the lock taken, waits, then reads the
    state again under the lock and opens the header the other node wrote — never formats."""
    cluster = Cluster(device, events, "encryptionPrepared")
    cluster.holder = "cephcsi-format@other-node/1"

    def other_node_done() -> None:  # the other node's format completes while this one waits
        cluster.metadata[STATE] = "encrypted"
        cluster.is_luks = True
        cluster.blkid = "TYPE=crypto_LUKS\nUSAGE=crypto\n"
        cluster.holder = None

    cluster.other_finishes = other_node_done
    stager, _ = make(cluster, events, FakeMapper(device, events))
    stager.crypt.format_wait = 5.0
    stager.stage(request(staging_dir(tmp_path)))
    assert events.log[:6] == ["map", "meta list", "lock busy", "lock get", "meta list", "lock break"]
    assert "luksFormat" not in events.log and "meta set encrypted" not in events.log
    assert "luksOpen" in events.log and cluster.holder is None


def test_a_lock_held_too_long_aborts_the_stage_and_formats_nothing(
        tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encryptionPrepared")
    cluster.holder = "cephcsi-rotate-key@other-node"
    mapper = FakeMapper(device, events)
    stager, _ = make(cluster, events, mapper)
    stager.crypt.format_wait = 0.0
    with pytest.raises(OperationInFlight, match=f"another node is formatting volume {VOLUME}.*retry"):
        stager.stage(request(staging_dir(tmp_path)))
    assert "luksFormat" not in events.log and "luksOpen" not in events.log
    assert cluster.holder == "cephcsi-rotate-key@other-node"  # another's lock is never broken
    assert cluster.metadata == {STATE: "encryptionPrepared"}  # the map stays for the retry


def test_a_failed_format_releases_the_lock(tmp_path: os.PathLike[str], device: str, events: Events) -> None:
    cluster = Cluster(device, events, "encryptionPrepared", blkid="TYPE=ext4\nUSAGE=filesystem\n")
    stager, _ = make(cluster, events, FakeMapper(device, events))
    with pytest.raises(FailedPrecondition, match="already holds"):
        stager.stage(request(staging_dir(tmp_path)))
    assert "lock get" in events.log and cluster.holder is None


@pytest.mark.parametrize("left", [29.0, 31.0])
def test_no_format_starts_when_the_lock_could_lapse_before_it_is_done(
        tmp_path: os.PathLike[str], device: str, events: Events, left: float) -> None:
    """The lock lapses FORMAT_LOCK_SECONDS (300 s) after it was taken: a format started when less
    is left than the probe's and luksFormat's bounds (2 × the 10 s command timeout) plus a 10 s
    margin could meet another node's format."""
    cluster = Cluster(device, events, "encryptionPrepared")
    now = [1000.0]

    def slow_meta_read(argv: list[str]) -> tuple[int, str, str] | None:
        if argv[:3] == ["rbd", "image-meta", "list"] and cluster.holder is not None:
            now[0] += 300 - left  # the state read under the lock hung that long
        return Cluster.respond(cluster, argv)

    cluster.respond = slow_meta_read  # type: ignore[method-assign]
    stager, _ = make(cluster, events, FakeMapper(device, events))
    stager.crypt.clock = lambda: now[0]
    if left > 30:
        stager.stage(request(staging_dir(tmp_path)))
        assert "luksFormat" in events.log and cluster.metadata == {STATE: "encrypted"}
    else:
        with pytest.raises(DeadlineExceeded, match="may lapse in 29 s.*Nothing was written; retry"):
            stager.stage(request(staging_dir(tmp_path)))
        assert "luksFormat" not in events.log and cluster.metadata == {STATE: "encryptionPrepared"}
    assert cluster.holder is None  # released either way: a retry takes it afresh


def test_a_lock_that_cannot_be_released_is_warned_about_and_the_stage_stands(
        tmp_path: os.PathLike[str], device: str, events: Events, caplog: pytest.LogCaptureFixture) -> None:
    """The lock's holders cannot be read (a refused or timed-out `rados`): release() says so instead
    of doing nothing silently, and the format that succeeded is not turned into a failure."""
    cluster = Cluster(device, events, "encryptionPrepared")

    def refused_info(argv: list[str]) -> tuple[int, str, str] | None:
        if argv[0] == "rados" and "info" in argv:
            return 1, "", "ERROR: rados_lock_get_lock_info(): (13) Permission denied"
        return Cluster.respond(cluster, argv)

    cluster.respond = refused_info  # type: ignore[method-assign]
    stager, _ = make(cluster, events, FakeMapper(device, events))
    with caplog.at_level("WARNING"):
        stager.stage(request(staging_dir(tmp_path)))
    assert "luksFormat" in events.log and "luksOpen" in events.log and cluster.metadata == {STATE: "encrypted"}
    assert "the volume's lock could not be released; it lapses by itself" in caplog.messages
    assert cluster.holder is not None  # left to lapse
