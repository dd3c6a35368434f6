"""config.json keys of ceph-csi that cephcsi does not implement are named once, with the reason;
unknown keys likewise; a malformed update keeps the last good configuration and says so."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from cephcsi.config import ignored
from cephcsi.config.clusters import ClusterRegistry

pytestmark = pytest.mark.unit


def _notes(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.fields["key"], r.fields["reason"]) for r in caplog.records  # type: ignore[attr-defined]
            if r.getMessage() == "config.json key ignored"]


def test_ignored_and_unknown_keys_are_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ignored._reported.clear()
    path = tmp_path / "config.json"
    path.write_text(json.dumps([{
        "clusterID": "c-compat", "monitors": ["10.0.0.1:6789"],
        "rbd": {"radosNamespace": "", "mirrorDaemonCount": 2, "netNamespaceFilePath": "/x"},
        "cephFS": {"subvolumeGroup": "csi"}, "nfs": {},
        "readAffinity": {"enabled": True, "crushLocationLabels": ["topology.kubernetes.io/zone"], "enable": True},
        "monitorz": [],
    }]))
    caplog.set_level(logging.WARNING, logger="cephcsi.config.ignored")
    registry = ClusterRegistry(str(path))
    registry.reload()
    notes = dict(_notes(caplog))
    # readAffinity is implemented (tests/unit/node/test_read_affinity.py): only its typo is named.
    assert sorted(notes) == ["cephFS", "monitorz", "nfs", "rbd.mirrorDaemonCount", "rbd.netNamespaceFilePath",
                             "readAffinity.enable"]
    assert "typo" in notes["monitorz"] and "typo" in notes["readAffinity.enable"]
    assert registry.get("c-compat").read_affinity.active
    assert len(_notes(caplog)) == 6  # the second load said nothing new


def test_malformed_update_keeps_the_last_good_configuration(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps([{"clusterID": "good", "monitors": ["10.0.0.1:6789"]}]))
    registry = ClusterRegistry(str(path))
    path.write_text('[{"clusterID": "good", "monitors": [')  # a broken edit
    os.utime(path, ns=(1, 1))
    caplog.set_level(logging.ERROR, logger="cephcsi.config.clusters")
    assert registry.get("good").monitors == ("10.0.0.1:6789",)
    assert registry.get("good").monitors == ("10.0.0.1:6789",)
    errors = [r for r in caplog.records if "keeping the last good configuration" in r.getMessage()]
    assert len(errors) == 1 and errors[0].fields["clusters"] == "good"  # type: ignore[attr-defined]
    path.write_text(json.dumps([{"clusterID": "fixed", "monitors": ["10.0.0.2:6789"]}]))
    assert registry.ids() == ["fixed"]
