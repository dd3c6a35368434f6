import json
import os
import stat

import pytest

from cephcsi.ceph.credentials import Credentials, is_cephx_key, key_file
from cephcsi.config.clusters import ClusterRegistry, parse_clusters
from cephcsi.errors import ConfigError, InvalidArgument, NotFound

pytestmark = pytest.mark.unit

KEY = "AQBs4EBnAAAAABAAx0ZEXbJvyWvv8ZoMBQ2YOA=="  # format-valid, generated for tests only


def test_key_format() -> None:
    assert is_cephx_key(KEY)
    assert not is_cephx_key("AQBs4EBnAAAAABAAx0ZEXbJvyWvv8ZoMBQ2YO===")
    assert not is_cephx_key("not base64!")
    assert not is_cephx_key("")


def test_credentials_from_secrets() -> None:
    creds = Credentials.from_secrets({"userID": "client.csi", "userKey": KEY})
    assert creds.user_id == "csi"
    assert KEY not in repr(creds)
    assert creds.fingerprint != Credentials("csi", KEY[:-4] + "AA==").fingerprint


@pytest.mark.parametrize(
    "secrets",
    [{}, {"userID": "csi"}, {"userKey": KEY}, {"userID": "csi", "userKey": "AQBadKey=="}, {"userID": "a b", "userKey": KEY}],
)
def test_bad_secrets_never_echo_the_key(secrets: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Credentials.from_secrets(secrets)
    assert "AQB" not in str(caught.value)


def test_key_file_is_private_and_removed() -> None:
    with key_file(Credentials("csi", KEY)) as path:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert open(path).read() == KEY
    assert not os.path.exists(path)


def test_parse_clusters() -> None:
    clusters = parse_clusters(json.dumps([
        {"clusterID": "c1", "monitors": ["10.0.0.1:6789", "10.0.0.2:6789"], "rbd": {"radosNamespace": "ns"}},
        {"clusterID": "c2", "monitors": ["[v2:10.0.0.3:3300,v1:10.0.0.3:6789]"]},
    ]))
    assert clusters["c1"].mon_host == "10.0.0.1:6789,10.0.0.2:6789"
    assert clusters["c1"].rados_namespace == "ns"
    assert clusters["c2"].rados_namespace == ""


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("{}", "JSON list"),
        ('[{"monitors": ["a:1"]}]', "clusterID"),
        ('[{"clusterID": "c/1", "monitors": ["a:1"]}]', "clusterID"),
        ('[{"clusterID": "c1", "monitors": []}]', "monitors"),
        ('[{"clusterID": "c1", "monitors": ["a:1"]}, {"clusterID": "c1", "monitors": ["a:1"]}]', "twice"),
    ],
)
def test_bad_config(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_clusters(text)
    assert fragment in str(caught.value)


def test_registry_reloads_changed_file(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "config.json"  # type: ignore[operator]
    path.write_text(json.dumps([{"clusterID": "c1", "monitors": ["a:1"]}]))
    registry = ClusterRegistry(str(path))
    assert registry.get("c1").monitors == ("a:1",)
    with pytest.raises(NotFound) as caught:
        registry.get("c2")
    assert "known: c1" in str(caught.value)
    path.write_text(json.dumps([{"clusterID": "c1", "monitors": ["a:1"]}, {"clusterID": "c2", "monitors": ["b:2"]}]))
    os.utime(path, ns=(1, 10**18))
    assert registry.get("c2").monitors == ("b:2",)


def test_registry_refuses_unreadable_file(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(ConfigError):
        ClusterRegistry(str(tmp_path / "missing.json"))  # type: ignore[operator]
