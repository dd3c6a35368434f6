"""NodeStageVolume of an rbd-nbd volume whose daemon died with an earlier plugin (DeviceRecovery.
release_lost_device): waits while the healer may still re-attach the device, refuses while pods
use the dead mount, and otherwise unmounts it so the stage maps afresh. End to end on a real
kernel: tests/vm/test_nbd_reattach.py."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

from cephcsi.ceph.credentials import Credentials
from cephcsi.errors import FailedPrecondition, OperationInFlight
from cephcsi.node import stage_record
from cephcsi.node.mappers.base import NBD
from cephcsi.node.mappers.nbd import NbdMapper
from cephcsi.node.mappers.nbd_attachments import Attachment, AttachmentStore
from cephcsi.node.mounts import MountEntry, Mounter
from cephcsi.node.stage_record import StageRecord
from cephcsi.node.stager import Stager
from tests.unit.node.fakes import FakeRunner

pytestmark = pytest.mark.unit

VOLUME = "0001-0004-ceph-0000000000000001-11111111-2222-3333-4444-555555555555"


def _entry(mount_point: str, mount_id: int) -> MountEntry:
    # A regular file stands in for /dev/nbd0: its st_rdev is 0:0, like these entries.
    return MountEntry(mount_id, 1, 0, 0, "/", mount_point, ("rw",), "ext4", "/dev/nbd0", ("rw",))


class RecordingMounter(Mounter):
    def __init__(self, runner: FakeRunner) -> None:
        super().__init__(runner, 10)
        self.unmounted: list[str] = []

    def unmount(self, target: str) -> None:
        self.unmounted.append(target)


class Setup:
    def __init__(self, tmp_path: pathlib.Path, published: bool, waiting: bool) -> None:
        self.kubelet = tmp_path / "kubelet"
        staging = self.kubelet / "plugins" / "st" / "globalmount"
        staging.mkdir(parents=True)
        device = tmp_path / "nbd0"
        device.write_bytes(b"")
        self.record = StageRecord(volume_id=VOLUME, staging_path=str(staging), cluster_id="ceph", pool="rbd",
                                  image="img", namespace="", mapper=NBD, access_type="mount", fs_type="ext4",
                                  device=str(device), formatted=True, staged=True)
        stage_record.save(self.record)
        self.table = [_entry(self.record.mount_path, 10)]
        if published:
            self.table.append(_entry(str(self.kubelet / "pods" / "p" / "mount"), 11))
        sys_block = tmp_path / "sys"
        (sys_block / "nbd0").mkdir(parents=True)
        if waiting:
            (sys_block / "nbd0" / "backend").write_text("cookie\n")
        store = AttachmentStore(str(tmp_path / "state"))
        store.save(Attachment(volume_id=VOLUME, pool="rbd", namespace="", image="img", device=str(device),
                              cookie="cookie", monitors="m", options=[], read_only=False, user_id="csi", key="k"))
        self.runner = FakeRunner(lambda argv: (0, json.dumps([]), "") if argv[:3] == ["rbd", "device", "list"] else None)
        mapper = NbdMapper(self.runner, 10, lambda p, t: None, 1, attachments=store, sys_block=str(sys_block))
        self.mounter = RecordingMounter(self.runner)
        self.stager = Stager({NBD: mapper}, None, self.mounter, self.runner, 10,  # type: ignore[arg-type]
                             str(self.kubelet), read_mounts=lambda: self.table)


def test_waits_while_the_device_may_still_be_reattached(tmp_path: pathlib.Path) -> None:
    setup = Setup(tmp_path, published=False, waiting=True)
    with pytest.raises(OperationInFlight, match="re-attach"):
        setup.stager.recovery.release_lost_device(setup.record)
    assert setup.mounter.unmounted == []


def test_refuses_while_pods_use_the_dead_mount(tmp_path: pathlib.Path) -> None:
    setup = Setup(tmp_path, published=True, waiting=False)
    with pytest.raises(FailedPrecondition, match="Restart the pods"):
        setup.stager.recovery.release_lost_device(setup.record)
    assert setup.mounter.unmounted == []


def test_unmounts_the_dead_mount_and_resumes_from_the_map(tmp_path: pathlib.Path) -> None:
    setup = Setup(tmp_path, published=False, waiting=False)
    setup.stager.recovery.release_lost_device(setup.record)
    assert setup.mounter.unmounted == [setup.record.mount_path]
    saved = stage_record.load(setup.record.staging_path)
    assert saved is not None and saved.staged is False and saved.device == "" and saved.formatted is True
    assert os.path.isdir(setup.record.staging_path)
