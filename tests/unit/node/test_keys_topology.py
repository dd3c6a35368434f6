from __future__ import annotations

import base64
import struct

import pytest

from cephcsi.errors import FailedPrecondition, InvalidArgument, Unavailable
from cephcsi.ceph.credentials import Credentials
from cephcsi.node.topology import KubeNodeLabels, segment_key, segments

pytestmark = pytest.mark.unit


def _key(secret_len: int = 16, key_type: int = 1) -> str:
    return base64.b64encode(struct.pack("<HIIH", key_type, 1700000000, 0, secret_len) + b"s" * secret_len).decode()


def test_well_formed_keys_pass() -> None:
    Credentials.from_secrets({"userID": "csi", "userKey": _key()})
    Credentials.from_secrets({"userID": "csi", "userKey": _key(32)})


@pytest.mark.parametrize("key", ["not base64!", "AQBfakefakefakefakefakefakefakefakefake==", "QUJD", _key(key_type=0)])
def test_malformed_keys_are_refused_without_echoing_them(key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Credentials.from_secrets({"userID": "csi", "userKey": key})
    assert key not in caught.value.message


def test_segments() -> None:
    labels = {"topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/region": "r1", "rack": "a"}
    got = segments("rbd.csi.ceph.com", ("topology.kubernetes.io/zone", "rack"), labels, "n1")
    assert got == {"topology.rbd.csi.ceph.com/zone": "z1", "topology.rbd.csi.ceph.com/rack": "a"}
    assert segment_key("x.example", "a/b/c") == "topology.x.example/c"


def test_missing_label() -> None:
    with pytest.raises(FailedPrecondition, match="lacks the topology label.*zone"):
        segments("rbd.csi.ceph.com", ("topology.kubernetes.io/zone",), {}, "n1")


def test_unusable_kubeconfig_is_unavailable(tmp_path: object) -> None:
    with pytest.raises(Unavailable, match="no usable Kubernetes client config"):
        KubeNodeLabels(kubeconfig=f"{tmp_path}/missing").labels("n1")
