"""ceph-csi's log-file strategy for the rbd-nbd log of a volume it staged, applied by cephcsi's
unstage of that stage (cephcsi.node.legacy_logs, from cephcsi.node.legacy_stage): names as
ceph-csi makes them, what each strategy leaves, and that nothing but the one plain file in logDir is ever touched."""
from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from cephcsi.node import legacy_stage, mounts
from cephcsi.node.legacy_logs import apply_log_strategy, compressed_name, nbd_log_name
from cephcsi.node.legacy_stage import load_stash
from cephcsi.node.mappers.base import KRBD, NBD, MapRequest
from cephcsi.node.stage_record import StageRecord
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOLUME_ID = "0001-0009-rook-ceph-0000000000000002-50d53503-9da1-11ed-847e-bacf8f2f1297"
CONTENT = b"2024-01-01 rbd-nbd: started\n" * 2000


def _log_file(log_dir: Path, content: bytes = CONTENT) -> Path:
    path = log_dir / nbd_log_name(VOLUME_ID)
    path.write_bytes(content)
    return path


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_names_are_ceph_csis() -> None:
    assert nbd_log_name(VOLUME_ID) == f"rbd-nbd-{VOLUME_ID}.log"
    assert compressed_name(nbd_log_name(VOLUME_ID)) == f"rbd-nbd-{VOLUME_ID}.gz"
    # GzipLogFile replaces every ".log" (a static volume's id is its image name, which may hold one).
    assert compressed_name(nbd_log_name("my.logs")) == "rbd-nbd-my.gzs.gz"


def test_stash_log_keys_are_read(tmp_path: Path) -> None:
    (tmp_path / "image-meta.json").write_text(json.dumps({
        "Version": 3, "pool": "rbd", "image": "csi-vol-1", "accessType": True, "device": "/dev/nbd0",
        "logDir": "/var/log/ceph", "logFileStrategy": "compress",
    }))
    stash = load_stash(str(tmp_path))
    assert stash is not None and (stash.log_dir, stash.log_strategy) == ("/var/log/ceph", "compress")
    (tmp_path / "image-meta.json").write_text(json.dumps({"pool": "rbd", "image": "csi-vol-1", "logDir": None}))
    stash = load_stash(str(tmp_path))
    assert stash is not None and (stash.log_dir, stash.log_strategy) == ("", "")


@pytest.mark.parametrize("strategy", ["remove", "Remove", "REMOVE"])
def test_remove_deletes_only_the_log_file(tmp_path: Path, strategy: str, caplog: pytest.LogCaptureFixture) -> None:
    log_file = _log_file(tmp_path)
    other = tmp_path / "rbd-nbd-other-volume.log"
    other.write_bytes(b"other")
    apply_log_strategy(VOLUME_ID, str(tmp_path), strategy)
    assert sorted(os.listdir(tmp_path)) == [other.name]
    assert not log_file.exists() and other.read_bytes() == b"other"
    assert _warnings(caplog) == []


def test_compress_writes_the_gz_and_removes_the_log(tmp_path: Path) -> None:
    log_file = _log_file(tmp_path)
    log_file.chmod(0o640)
    gz = tmp_path / f"rbd-nbd-{VOLUME_ID}.gz"
    gz.write_bytes(b"an older unstage's log")  # replaced, as ceph-csi's O_TRUNC does
    apply_log_strategy(VOLUME_ID, str(tmp_path), "compress")
    assert os.listdir(tmp_path) == [gz.name]
    assert gzip.decompress(gz.read_bytes()) == CONTENT
    assert stat.S_IMODE(gz.stat().st_mode) == 0o640


@pytest.mark.parametrize("strategy", ["preserve", "PRESERVE", ""])
def test_preserve_or_nothing_said_leaves_it(tmp_path: Path, strategy: str, caplog: pytest.LogCaptureFixture) -> None:
    log_file = _log_file(tmp_path)
    apply_log_strategy(VOLUME_ID, str(tmp_path), strategy)
    assert os.listdir(tmp_path) == [log_file.name] and log_file.read_bytes() == CONTENT
    assert _warnings(caplog) == []


def test_unknown_strategy_is_logged_and_the_file_left(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log_file = _log_file(tmp_path)
    apply_log_strategy(VOLUME_ID, str(tmp_path), "shred")
    assert log_file.read_bytes() == CONTENT
    [record] = _warnings(caplog)
    assert "unknown logFileStrategy" in record.getMessage()
    assert getattr(record, "fields")["strategy"] == "shred"


def test_no_log_dir_means_no_action(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ceph-csi acts only when the stash names a directory (its default /var/log/ceph is for the map).
    monkeypatch.chdir(tmp_path)
    log_file = _log_file(tmp_path)
    apply_log_strategy(VOLUME_ID, "", "remove")
    assert log_file.exists()


@pytest.mark.parametrize("strategy", ["remove", "compress"])
def test_missing_file_is_quiet(tmp_path: Path, strategy: str, caplog: pytest.LogCaptureFixture) -> None:
    apply_log_strategy(VOLUME_ID, str(tmp_path), strategy)  # never written, or a retried unstage
    assert os.listdir(tmp_path) == [] and _warnings(caplog) == []


@pytest.mark.parametrize("log_dir", ["relative/dir", "/nonexistent-cephcsi-test-dir"])
def test_unusable_log_dir_warns(tmp_path: Path, log_dir: str, caplog: pytest.LogCaptureFixture) -> None:
    apply_log_strategy(VOLUME_ID, log_dir, "remove")
    [record] = _warnings(caplog)
    assert getattr(record, "fields")["log_dir"] == log_dir


def test_volume_id_cannot_leave_the_log_dir(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    inner = tmp_path / "logs"
    inner.mkdir()
    victim = tmp_path / "x.log"
    victim.write_bytes(b"keep")
    (inner / "rbd-nbd-..").mkdir()
    apply_log_strategy("../../../x", str(inner), "remove")  # would resolve to victim
    assert victim.read_bytes() == b"keep" and len(_warnings(caplog)) == 1


@pytest.mark.parametrize("strategy", ["remove", "compress"])
def test_symlink_is_never_followed(tmp_path: Path, strategy: str, caplog: pytest.LogCaptureFixture) -> None:
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.write_bytes(b"not a log")
    link = log_dir / nbd_log_name(VOLUME_ID)
    link.symlink_to(outside)
    apply_log_strategy(VOLUME_ID, str(log_dir), strategy)
    assert link.is_symlink() and outside.read_bytes() == b"not a log"
    assert os.listdir(log_dir) == [link.name]
    assert len(_warnings(caplog)) == 1


def test_compress_never_writes_through_a_symlinked_gz(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.write_bytes(b"not a log")
    log_file = _log_file(log_dir)
    (log_dir / compressed_name(log_file.name)).symlink_to(outside)
    apply_log_strategy(VOLUME_ID, str(log_dir), "compress")
    assert outside.read_bytes() == b"not a log" and log_file.read_bytes() == CONTENT
    assert len(_warnings(caplog)) == 1


@pytest.mark.parametrize("strategy", ["remove", "compress"])
def test_hard_link_is_left(tmp_path: Path, strategy: str) -> None:
    log_dir, outside = tmp_path / "logs", tmp_path / "outside"
    log_dir.mkdir()
    outside.write_bytes(b"secret")
    os.link(outside, log_dir / nbd_log_name(VOLUME_ID))
    apply_log_strategy(VOLUME_ID, str(log_dir), strategy)
    assert os.listdir(log_dir) == [nbd_log_name(VOLUME_ID)] and outside.read_bytes() == b"secret"


@pytest.mark.parametrize("strategy", ["remove", "compress"])
def test_directory_or_fifo_is_left(tmp_path: Path, strategy: str) -> None:
    (tmp_path / nbd_log_name(VOLUME_ID)).mkdir()
    apply_log_strategy(VOLUME_ID, str(tmp_path), strategy)
    assert (tmp_path / nbd_log_name(VOLUME_ID)).is_dir()
    other = tmp_path / "fifo"
    other.mkdir()
    os.mkfifo(other / nbd_log_name(VOLUME_ID))
    apply_log_strategy(VOLUME_ID, str(other), strategy)  # must not block on the FIFO
    assert os.listdir(other) == [nbd_log_name(VOLUME_ID)]


def test_failed_compress_keeps_the_log_and_drops_the_partial_gz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    log_file = _log_file(tmp_path)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", full_disk)
    apply_log_strategy(VOLUME_ID, str(tmp_path), "compress")
    assert os.listdir(tmp_path) == [log_file.name] and log_file.read_bytes() == CONTENT
    [record] = _warnings(caplog)
    assert "No space left" in getattr(record, "fields")["error"]


# -- in LegacyUnstager: after the rbd-nbd unmap, before the stash goes ----------------------


class FakeMapper:
    def __init__(self, name: str, log_file: Path, fail: bool = False) -> None:
        self.name = name
        self.log_file = log_file
        self.fail = fail
        self.unmapped: list[str] = []

    def work_dir_for(self, volume_id: str, staging_path: str) -> str:
        return ""

    def map(self, request: MapRequest) -> str:
        raise AssertionError("not used")

    def find(self, record: StageRecord) -> str | None:
        return None

    def unmap(self, record: StageRecord) -> None:
        assert self.log_file.exists(), "the log strategy ran before the unmap"
        if self.fail:
            raise OSError("unmap failed")
        self.unmapped.append(str(record.image_spec))


def _legacy_stage(root: Path, nbd: bool) -> tuple[Path, Path]:
    staging, log_dir = root / "staging", root / "logs"
    staging.mkdir()
    log_dir.mkdir()
    (staging / VOLUME_ID).mkdir()
    (staging / "image-meta.json").write_text(json.dumps({
        "Version": 3, "pool": "rbd", "image": "csi-vol-1", "accessType": nbd, "device": "/dev/nbd0" if nbd else "",
        "logDir": str(log_dir), "logFileStrategy": "remove",
    }))
    return staging, _log_file(log_dir)


def _unstager(mapper: FakeMapper) -> legacy_stage.LegacyUnstager:
    return legacy_stage.LegacyUnstager({mapper.name: mapper}, mounts.Mounter(FakeRunner(), 5), "", read_mounts=lambda: [])


def test_unstage_of_nbd_stage_applies_the_strategy(tmp_path: Path) -> None:
    staging, log_file = _legacy_stage(tmp_path, nbd=True)
    mapper = FakeMapper(NBD, log_file)
    _unstager(mapper).unstage(VOLUME_ID, str(staging))
    assert mapper.unmapped == ["rbd/csi-vol-1"]
    assert os.listdir(staging) == [] and not log_file.exists()


def test_unstage_of_krbd_stage_leaves_log_files(tmp_path: Path) -> None:
    staging, log_file = _legacy_stage(tmp_path, nbd=False)
    _unstager(FakeMapper(KRBD, log_file)).unstage(VOLUME_ID, str(staging))
    assert os.listdir(staging) == [] and log_file.exists()


def test_failed_unmap_leaves_the_log_and_the_stash(tmp_path: Path) -> None:
    staging, log_file = _legacy_stage(tmp_path, nbd=True)
    with pytest.raises(OSError):
        _unstager(FakeMapper(NBD, log_file, fail=True)).unstage(VOLUME_ID, str(staging))
    assert log_file.exists() and os.listdir(staging) == ["image-meta.json"]
