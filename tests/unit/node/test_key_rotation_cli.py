"""`cephcsi rotate-key`'s pure parts: the Secret read from stdin, the stage found by its record,
and what is refused before anything is touched."""
from __future__ import annotations

import base64
import io
import json
import os
from pathlib import Path

import pytest

from cephcsi.cli import main as cli_main
from cephcsi.cli.rotate_key import parse_secret
from cephcsi.errors import FailedPrecondition, InvalidArgument, OperationInFlight
from cephcsi.node import stage_record
from cephcsi.node.key_rotation import find_stage, node_lock

pytestmark = pytest.mark.unit


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_kubectl_secret_is_decoded_and_string_data_wins() -> None:
    doc = {"apiVersion": "v1", "kind": "Secret", "data": {"userID": b64("csi"), "userKey": b64("AQB=")},
           "stringData": {"encryptionPassphrase": "p"}}
    assert parse_secret(json.dumps(doc)) == {"userID": "csi", "userKey": "AQB=", "encryptionPassphrase": "p"}
    assert parse_secret('{"userID": "csi"}') == {"userID": "csi"}


@pytest.mark.parametrize("text", ["not json", "[1]", '{"kind": "Secret", "data": {"k": "%%%"}}', '{"k": 1}'])
def test_what_is_no_secret_is_refused(text: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_secret(text)


def record(tmp_path: Path, volume_id: str, **changes: object) -> str:
    staging = tmp_path / "plugins/kubernetes.io/csi/rbd.csi.ceph.com" / volume_id[-4:] / "globalmount"
    staging.mkdir(parents=True)
    values: dict[str, object] = dict(volume_id=volume_id, staging_path=str(staging), cluster_id="c", pool="p",
                                     image="i", namespace="", mapper="krbd", access_type="block",
                                     device="/dev/rbd0", encryption="block", crypt_name=f"luks-rbd-{volume_id}",
                                     staged=True)
    values.update(changes)
    stage_record.save(stage_record.StageRecord(**values))  # type: ignore[arg-type]
    return str(staging)


def test_the_stage_is_found_by_its_record(tmp_path: Path) -> None:
    record(tmp_path, "vol-aaaa")
    path = record(tmp_path, "vol-bbbb")
    found = find_stage(str(tmp_path), "vol-bbbb")
    assert found.staging_path == path and found.device == "/dev/rbd0"
    assert find_stage(str(tmp_path), "vol-bbbb", staging_path=path).volume_id == "vol-bbbb"
    with pytest.raises(FailedPrecondition, match="not staged on this node"):
        find_stage(str(tmp_path), "vol-cccc")


@pytest.mark.parametrize("changes, says", [({"crypt_name": "", "encryption": ""}, "not .or not completely. as an encrypted"),
                                           ({"staged": False}, "not .or not completely."),
                                           ({"read_only": True}, "staged read-only")])
def test_a_stage_that_cannot_rotate_is_refused(tmp_path: Path, changes: dict[str, object], says: str) -> None:
    record(tmp_path, "vol-dddd", **changes)
    with pytest.raises(FailedPrecondition, match=says):
        find_stage(str(tmp_path), "vol-dddd")


def test_one_rotation_per_volume_on_a_node(tmp_path: Path) -> None:
    with node_lock(str(tmp_path), "vol"):
        with pytest.raises(OperationInFlight):
            with node_lock(str(tmp_path), "vol"):
                pass
        with node_lock(str(tmp_path), "other"):
            pass
    with node_lock(str(tmp_path), "vol"):
        pass
    assert oct(os.stat(tmp_path / "rotate-key-vol.lock").st_mode & 0o777) == "0o600"


def test_the_subcommand_refuses_the_default_kms_before_looking_for_the_stage(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
    assert cli_main.main(["rotate-key", "--volume-id", "v", "--kms-id", "default",
                          "--kubelet-dir", str(tmp_path)]) == 1
    assert "default KMS" in capsys.readouterr().err
