"""Lease naming and namespace resolution of the controller loops."""
from __future__ import annotations

import pytest

from cephcsi.errors import ConfigError
from cephcsi.sidecars.controller import lease_name, lease_namespace

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("driver,lease", [("rbd.csi.ceph.com", "rbd-csi-ceph-com"), ("a/b.c", "a-b-c"), ("x.", "x-X")])
def test_lease_name_is_sanitised_like_csi_lib_utils(driver: str, lease: str) -> None:
    assert lease_name(driver) == lease


def test_lease_namespace_order(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    sa = tmp_path / "namespace"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert lease_namespace("flag", str(sa)) == "flag"
    assert lease_namespace("", str(sa)) == "from-env"
    sa.write_text("from-pod\n")
    assert lease_namespace("", str(sa)) == "from-pod"
    monkeypatch.delenv("POD_NAMESPACE")
    with pytest.raises(ConfigError, match="--leader-election-namespace"):
        lease_namespace("", str(tmp_path / "missing"))
