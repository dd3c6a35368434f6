"""Rendering, flag handling (the key never on argv, never printed), the trash-spec decoding,
PV filtering and the repair gatekeeping that needs no cluster."""
from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from kubernetes import client as k8s

from cephcsi.audit import report
from cephcsi.audit.model import Finding, Fix, Kind, Outcome, Repair, Snapshot
from cephcsi.audit.pvs import pv_view
from cephcsi.audit.repair import ORDER, RepairContext, repair_all
from cephcsi.audit.scan import decode_deferment
from cephcsi.ceph.trash import InlinePurges
from cephcsi.cli import audit as cli
from cephcsi.cli import main as cli_main
from cephcsi.errors import InvalidArgument
from cephcsi.volumes.volume_id import VolumeId

pytestmark = pytest.mark.unit

KEY = "AQBvHARrtzhtKhAANqiNk4814H0PUS4/xkGJKg=="
U1 = "11111111-1111-4111-8111-111111111111"
SCOPE = report.Scope("c1", "rbd", "", "default", "csi-vol-", False)
ORPHAN = Finding(Kind.ORPHAN_IMAGE, f"csi-vol-{U1}", "no record", uuid=U1, image_name=f"csi-vol-{U1}",
                 fix=Fix.TRASH_ORPHAN)
KEYLESS = Finding(Kind.DANGLING_KEY, "pvc-1", "no record", uuid=U1, name="pvc-1", fix=Fix.RELEASE_KEY)


def trash_spec(name: str, deleted: int, deferred: int, state: int) -> bytes:
    body = bytes([0]) + struct.pack("<I", len(name)) + name.encode() + struct.pack("<IIII", deleted, 0, deferred, 5)
    body += bytes([state])
    return bytes([2, 1]) + struct.pack("<I", len(body)) + body


def test_the_trash_deferment_is_decoded() -> None:
    assert decode_deferment(trash_spec("csi-vol-x", 1000, 2000, 0)) == pytest.approx(2000 + 5e-9)
    assert decode_deferment(trash_spec("n", 1000, 1000, 1)[:-10]) == 0.0  # truncated: no deferment


def test_clean_and_exit_semantics() -> None:
    assert report.AuditResult(SCOPE, (), None).clean
    assert not report.AuditResult(SCOPE, (ORPHAN,), None).clean
    repaired = report.AuditResult(SCOPE, (KEYLESS,), (Repair(KEYLESS, Outcome.REPAIRED, "released"),))
    assert repaired.clean
    skipped = report.AuditResult(SCOPE, (KEYLESS, ORPHAN), (Repair(KEYLESS, Outcome.RESOLVED, "gone"),
                                                            Repair(ORPHAN, Outcome.SKIPPED, "flag")))
    assert not skipped.clean


def test_json_carries_every_finding_and_its_repair() -> None:
    result = report.AuditResult(SCOPE, (KEYLESS, ORPHAN), (Repair(KEYLESS, Outcome.REPAIRED, "released the name key"),
                                                           Repair(ORPHAN, Outcome.SKIPPED, "needs a flag")),
                                notes=("a note",))
    doc = json.loads(report.to_json(result))
    assert doc["clean"] is False and doc["repaired"] is True and doc["notes"] == ["a note"]
    assert doc["counts"] == {"dangling-key": 1, "orphan-image": 1}
    first = doc["findings"][0]
    assert first["kind"] == "dangling-key" and first["fix"] == "release-key"
    assert first["repair"] == {"outcome": "repaired", "action": "released the name key"}


def test_table_says_what_repair_would_do() -> None:
    text = report.to_table(report.AuditResult(SCOPE, (KEYLESS,), None))
    assert "dangling-key" in text and "--repair would release-key" in text and "1 finding(s)" in text
    assert "no inconsistencies found" in report.to_table(report.AuditResult(SCOPE, (), None))


def test_key_comes_from_a_file_or_keyring_or_the_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "key"
    bare.write_text(KEY + "\n")
    keyring = tmp_path / "keyring"
    keyring.write_text(f"[client.csi]\n\tkey = {KEY}\n\tcaps mon = \"profile rbd\"\n")
    assert cli.read_key(str(bare)) == KEY
    assert cli.read_key(str(keyring)) == KEY
    monkeypatch.setenv(cli.KEY_ENV, KEY)
    assert cli.read_key("") == KEY
    monkeypatch.delenv(cli.KEY_ENV)
    with pytest.raises(InvalidArgument, match=cli.KEY_ENV):
        cli.read_key("")


def test_there_is_no_flag_that_takes_a_key() -> None:
    options = [o for action in cli.build_parser()._actions for o in action.option_strings]
    assert not [o for o in options if o.endswith("-key") or o == "--key"]


def test_usage_errors_exit_2_and_never_echo_the_key(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["audit", "--config-file", str(tmp_path / "none.json"), "--cluster-id", "c1", "--pool", "rbd",
            "--user", "csi"]
    with pytest.raises(SystemExit) as exited:
        cli_main.main(base + ["--repair-orphan-images", "--repair"])
    assert exited.value.code == 2 and "--kubeconfig" in capsys.readouterr().err
    monkeypatch.setenv(cli.KEY_ENV, "not-a-key-" + KEY)
    assert cli_main.main(base) == 2
    err = capsys.readouterr().err
    assert "not a cephx key" in err and KEY not in err
    monkeypatch.setenv(cli.KEY_ENV, KEY)
    assert cli_main.main(base) == 2  # config.json cannot be read: a clear message, exit 2
    err = capsys.readouterr().err
    assert "none.json" in err and KEY not in err


def test_the_driver_command_line_is_untouched() -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["--mode=bogus"])
    assert exited.value.code == 2


def pv(handle: str, driver: str = "rbd.csi.ceph.com",
       attributes: dict[str, str] | None = None) -> k8s.V1PersistentVolume:
    return k8s.V1PersistentVolume(
        metadata=k8s.V1ObjectMeta(name="pv-a"),
        spec=k8s.V1PersistentVolumeSpec(csi=k8s.V1CSIPersistentVolumeSource(
            driver=driver, volume_handle=handle, volume_attributes=attributes)),
        status=k8s.V1PersistentVolumeStatus(phase="Bound"))


def test_pvs_are_filtered_by_driver_cluster_and_pool() -> None:
    handle = VolumeId("c1", 3, U1).encode()
    assert pv_view(pv(handle), "rbd.csi.ceph.com", "c1", 3, "rbd").uuid == U1  # type: ignore[union-attr]
    assert pv_view(pv(handle, driver="other"), "rbd.csi.ceph.com", "c1", 3, "rbd") is None
    assert pv_view(pv(handle), "rbd.csi.ceph.com", "c2", 3, "rbd") is None
    assert pv_view(pv(handle), "rbd.csi.ceph.com", "c1", 4, "rbd") is None
    static = pv_view(pv("my-image", attributes={"pool": "rbd", "imageName": "my-image"}), "rbd.csi.ceph.com",
                     "c1", 3, "rbd")
    assert static is not None and (static.uuid, static.image_name) == ("", "my-image")
    assert pv_view(k8s.V1PersistentVolume(metadata=k8s.V1ObjectMeta(name="nfs"), spec=k8s.V1PersistentVolumeSpec()),
                   "rbd.csi.ceph.com", "c1", 3, "rbd") is None


def test_repairs_run_in_dependency_order_and_gatekeep_without_touching_ceph() -> None:
    # No session/io: every finding here must be turned away before any Ceph call.
    context = RepairContext(session=None, io=None, pool="rbd", journal=None,  # type: ignore[arg-type]
                            snapshot=Snapshot(prefix="csi-vol-"), inline=InlinePurges())
    report_only = Finding(Kind.STRAY_HEADER, "rbd_header.x", "d", why_not="holds data")
    not_ours = Finding(Kind.PARTIAL_CREATE, "other", "d", ours=False, fix=Fix.REMOVE_PARTIAL)
    repairs = {r.finding.kind: r for r in repair_all(context, [report_only, not_ours, ORPHAN])}
    assert all(r.outcome is Outcome.SKIPPED for r in repairs.values())
    assert repairs[Kind.ORPHAN_IMAGE].action.startswith("orphan images are moved to the trash only with")
    assert repairs[Kind.STRAY_HEADER].action == "holds data"
    assert ORDER.index(Fix.REMOVE_PARTIAL) < ORDER.index(Fix.REMOVE_RECORD) < ORDER.index(Fix.RELEASE_KEY)


def test_json_and_table_name_the_journal_of_each_finding() -> None:
    from cephcsi.audit.model import JournalType

    snapshot_key = Finding(Kind.DANGLING_KEY, "snap-1", "no record", uuid=U1, name="snap-1", fix=Fix.RELEASE_KEY,
                           journal=JournalType.SNAPSHOT)
    stray = Finding(Kind.STRAY_HEADER, "rbd_header.x", "no name", journal=None)
    result = report.AuditResult(SCOPE, (KEYLESS, snapshot_key, stray), None)
    doc = json.loads(report.to_json(result))
    assert [f["journal"] for f in doc["findings"]] == ["volume", "snapshot", None]
    assert doc["snapshot_name_prefix"] == "csi-snap-" and doc["volume_name_prefix"] == "csi-vol-"
    # The fields consumers already read are all still there, under their names.
    assert {"kind", "subject", "detail", "uuid", "name", "image_name", "image_id", "ours", "fix", "why_not",
            "owner", "repair"} <= set(doc["findings"][0])
    rows = report.to_table(result).splitlines()
    assert "JOURNAL" in rows[1]
    assert any("dangling-key" in r and " snapshot " in r and "snap-1" in r for r in rows)
    assert any("stray-header" in r and " - " in r for r in rows)


def test_the_snapshot_prefix_must_differ_from_the_volume_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cli.KEY_ENV, KEY)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--cluster-id", "c", "--pool", "p", "--user", "u", "--snapshot-name-prefix", "csi-vol-"])
    assert exit_info.value.code == cli.USAGE_ERROR
    a = cli.build_parser().parse_args(["--cluster-id", "c", "--pool", "p", "--user", "u",
                                       "--snapshot-name-prefix", "team-snap-"])
    assert cli.options_from(a).snapshot_prefix == "team-snap-"
