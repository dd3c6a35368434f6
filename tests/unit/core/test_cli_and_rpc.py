import subprocess
import sys

import grpc
import pytest
from google.protobuf.message import Message

from cephcsi._generated import csi_pb2
from cephcsi.cli.args import parse_settings
from cephcsi.csi.capabilities import require_supported, unsupported_reason
from cephcsi.csi.rpc import ServicerBase, rpc
from cephcsi.errors import Internal, InvalidArgument, NotFound
from cephcsi.observability.redact import redacted

pytestmark = pytest.mark.unit

Mode = csi_pb2.VolumeCapability.AccessMode


def test_defaults_follow_the_sidecars() -> None:
    s = parse_settings(["--mode=controller"])
    assert s.driver_name == "rbd.csi.ceph.com"
    assert s.sidecars.enabled == ("provisioner", "attacher", "resizer", "snapshotter")
    assert (s.sidecars.lease_duration, s.sidecars.renew_deadline, s.sidecars.retry_period) == (15, 10, 2)
    assert s.sidecars.retry_interval_start == 1 and s.sidecars.retry_interval_max == 300


def test_go_style_durations_and_loops() -> None:
    s = parse_settings(["--mode=node", "--nodeid=n1", "--timeout=2m", "--leader-election-retry-period=500ms", "--sidecars=none"])
    assert s.sidecars.timeout == 120 and s.sidecars.retry_period == 0.5
    assert s.sidecars.enabled == ()
    assert parse_settings(["--mode=controller", "--journal-lock-timeout=2.7s"]).ceph.journal_lock_seconds == 2


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--mode=bogus"], "invalid choice"),
        (["--mode=node"], "--nodeid is required"),
        (["--mode=controller", "--sidecars=registrar"], "cannot run in --mode=controller"),
        (["--mode=controller", "--timeout=soon"], "not a duration"),
        (["--mode=controller", "--leader-election-renew-deadline=20s"], "shorter than"),
        (["--mode=controller", "--journal-lock-timeout=500ms"], "below 1s"),
    ],
)
def test_bad_flags_fail_with_one_line(argv: list[str], fragment: str) -> None:
    out = subprocess.run([sys.executable, "-m", "cephcsi", *argv], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in out.stderr


def test_unreadable_config_fails_with_one_line(tmp_path: pytest.TempPathFactory) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cephcsi", "--mode=controller", f"--config-file={tmp_path}/none.json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "cannot read cluster config" in out.stderr and "Traceback" not in out.stderr


def test_redaction_strips_every_secret_field() -> None:
    request = csi_pb2.NodeStageVolumeRequest(volume_id="v", secrets={"userKey": "AQsecret"}, volume_context={"a": "b"})
    doc = redacted(request)
    assert "AQsecret" not in str(doc) and doc["volume_context"] == {"a": "b"}
    for message in (csi_pb2.CreateVolumeRequest, csi_pb2.DeleteVolumeRequest, csi_pb2.NodePublishVolumeRequest,
                    csi_pb2.ValidateVolumeCapabilitiesRequest, csi_pb2.ControllerExpandVolumeRequest):
        assert "AQsecret" not in str(redacted(message(secrets={"userKey": "AQsecret"})))


def _cap(mode: Mode.Mode, block: bool = False, fs: str = "") -> csi_pb2.VolumeCapability:
    if block:
        return csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=Mode(mode=mode))
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs), access_mode=Mode(mode=mode))


def test_capabilities() -> None:
    assert unsupported_reason(_cap(Mode.SINGLE_NODE_WRITER)) is None
    assert unsupported_reason(_cap(Mode.SINGLE_NODE_MULTI_WRITER, fs="xfs")) is None
    assert unsupported_reason(_cap(Mode.MULTI_NODE_MULTI_WRITER, block=True)) is None
    assert "Block" in (unsupported_reason(_cap(Mode.MULTI_NODE_MULTI_WRITER)) or "")
    assert "btrfs" in (unsupported_reason(_cap(Mode.SINGLE_NODE_WRITER, fs="btrfs")) or "")
    with pytest.raises(InvalidArgument):
        require_supported([])
    with pytest.raises(InvalidArgument):
        require_supported([csi_pb2.VolumeCapability(access_mode=Mode(mode=Mode.SINGLE_NODE_WRITER))])
    with pytest.raises(InvalidArgument):
        require_supported([csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume())])


class _Servicer(ServicerBase):
    service_name = "Test"

    @rpc
    def Fails(self, request: Message, context: object) -> None:
        raise NotFound("no such volume")

    @rpc
    def Crashes(self, request: Message, context: object) -> None:
        raise ZeroDivisionError("boom")


class _Context:
    def abort(self, code: grpc.StatusCode, message: str) -> None:
        self.aborted = (code, message)
        raise RuntimeError("aborted")


def test_rpc_decorator_maps_errors_over_grpc_and_in_process() -> None:
    servicer, context = _Servicer(), _Context()
    with pytest.raises(RuntimeError):
        servicer.Fails(csi_pb2.ProbeRequest(), context)
    assert context.aborted == (grpc.StatusCode.NOT_FOUND, "no such volume")
    with pytest.raises(RuntimeError):
        servicer.Crashes(csi_pb2.ProbeRequest(), context)
    assert context.aborted[0] is grpc.StatusCode.INTERNAL and "boom" not in context.aborted[1]
    with pytest.raises(NotFound):
        servicer.Fails(csi_pb2.ProbeRequest(), None)
    with pytest.raises(Internal):
        servicer.Crashes(csi_pb2.ProbeRequest(), None)
