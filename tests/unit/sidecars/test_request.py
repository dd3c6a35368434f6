"""Claim + class → CreateVolume request."""
from __future__ import annotations

import pytest

from cephcsi._generated import csi_pb2
from cephcsi.errors import InvalidArgument
from cephcsi.sidecars.provisioner.request import RequestOptions, format_bytes, plan, quantity_bytes, strip_reserved
from tests.unit.sidecars.fixtures import DRIVER, claim, storage_class

pytestmark = pytest.mark.unit

Mode = csi_pb2.VolumeCapability.AccessMode
OPTIONS = RequestOptions(DRIVER, default_fstype="ext4", single_node_multi_writer=True)


@pytest.mark.parametrize("text,expected", [("1Gi", 1 << 30), ("10Mi", 10 << 20), ("1.5Gi", 3 << 29), ("1G", 10**9),
                                           ("100", 100), ("1e3", 1000), ("100m", 1), ("0.5Ki", 512)])
def test_quantities(text: str, expected: int) -> None:
    assert quantity_bytes(text, "x") == expected


@pytest.mark.parametrize("size,text", [(1 << 30, "1Gi"), (8 << 20, "8Mi"), (1536 << 20, "1536Mi"), (1000, "1000"), (0, "0")])
def test_capacity_is_written_canonically(size: int, text: str) -> None:
    assert format_bytes(size) == text


def test_bad_quantity_names_the_field() -> None:
    with pytest.raises(InvalidArgument, match="requests.storage 'lots'"):
        plan(claim(size="lots"), storage_class(), OPTIONS)


def test_filesystem_claim() -> None:
    c = claim(uid="u1", size="2Gi", resources={"requests": {"storage": "2Gi"}, "limits": {"storage": "4Gi"}})
    sc = storage_class(parameters={"clusterID": "c1", "pool": "rbd", "csi.storage.k8s.io/fstype": "xfs",
                                   "csi.storage.k8s.io/provisioner-secret-name": "s",
                                   "csi.storage.k8s.io/provisioner-secret-namespace": "n"},
                       mountOptions=["discard"])
    planned = plan(c, sc, OPTIONS)
    request = planned.to_proto(OPTIONS, {"userID": "u"})
    assert request.name == "pvc-u1"
    assert (request.capacity_range.required_bytes, request.capacity_range.limit_bytes) == (2 << 30, 4 << 30)
    assert dict(request.parameters) == {"clusterID": "c1", "pool": "rbd"}
    (capability,) = request.volume_capabilities
    assert capability.mount.fs_type == "xfs" and list(capability.mount.mount_flags) == ["discard"]
    assert capability.access_mode.mode == Mode.SINGLE_NODE_MULTI_WRITER
    assert dict(request.secrets) == {"userID": "u"}


def test_default_fstype_and_rwo_without_multi_writer() -> None:
    options = RequestOptions(DRIVER, default_fstype="ext4", single_node_multi_writer=False)
    (capability,) = plan(claim(), storage_class(), options).capabilities(False)
    assert capability.mount.fs_type == "ext4"
    assert capability.access_mode.mode == Mode.SINGLE_NODE_WRITER


def test_block_claim_with_several_modes() -> None:
    planned = plan(claim(volume_mode="Block", modes=("ReadWriteMany", "ReadOnlyMany", "ReadWriteOncePod")),
                   storage_class(), OPTIONS)
    assert planned.block and planned.fs_type == ""
    caps = planned.capabilities(True)
    assert all(c.HasField("block") for c in caps)
    assert [c.access_mode.mode for c in caps] == [Mode.MULTI_NODE_MULTI_WRITER, Mode.MULTI_NODE_READER_ONLY,
                                                  Mode.SINGLE_NODE_SINGLE_WRITER]


def test_extra_create_metadata() -> None:
    options = RequestOptions(DRIVER, extra_create_metadata=True)
    planned = plan(claim("data", "team", uid="u1"), storage_class(), options)
    assert planned.parameters["csi.storage.k8s.io/pvc/name"] == "data"
    assert planned.parameters["csi.storage.k8s.io/pvc/namespace"] == "team"
    assert planned.parameters["csi.storage.k8s.io/pv/name"] == "pvc-u1"


def test_unknown_reserved_keys_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="csi.storage.k8s.io/typo"):
        strip_reserved({"csi.storage.k8s.io/typo": "x", "pool": "rbd"})


def test_unknown_access_mode() -> None:
    with pytest.raises(InvalidArgument, match="ReadSometimes"):
        plan(claim(modes=("ReadSometimes",)), storage_class(), OPTIONS)
