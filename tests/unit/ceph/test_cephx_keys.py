"""cephcsi.ceph.cephx_keys: reading a userKey's cipher without librados, and the verdicts on it."""
from __future__ import annotations

import base64
import os
import struct

from collections.abc import Callable

import pytest
import rados

from cephcsi.ceph import cephx_keys
from cephcsi.ceph.connection import ConnectionCache
from cephcsi.config.clusters import ClusterConfig
from cephcsi.settings import CephSettings
from cephcsi.ceph.credentials import Credentials, is_cephx_key
from cephcsi.errors import FailedPrecondition, InvalidArgument

pytestmark = pytest.mark.unit


def make_key(cipher: int, secret: bytes, declared: int | None = None) -> str:
    """A key laid out as Ceph's CryptoKey::encode writes it: u16 type, u32 seconds, u32 nanoseconds,
    u16 length, secret."""
    header = struct.pack("<HIIH", cipher, 1_790_000_000, 123, len(secret) if declared is None else declared)
    return base64.b64encode(header + secret).decode()


AES_KEY = make_key(1, os.urandom(16))
AES256K_KEY = make_key(2, os.urandom(32))
Opener = Callable[[ClusterConfig, Credentials, CephSettings], rados.Rados]
OLD = cephx_keys.Client("librados", "16.2.15", reads_aes256k=False)
NEW = cephx_keys.Client("librados", "20.2.4", reads_aes256k=True)


def test_the_two_ciphers_have_the_shapes_ceph_gives_them() -> None:
    assert AES_KEY.startswith("AQ") and len(AES_KEY) == 40
    assert AES256K_KEY.startswith("Ag") and len(AES256K_KEY) == 60
    assert cephx_keys.inspect(AES_KEY) == cephx_keys.KeyInfo(cephx_keys.AES, 16)
    assert cephx_keys.inspect(AES256K_KEY) == cephx_keys.KeyInfo(cephx_keys.AES256K, 32)
    assert cephx_keys.inspect(AES256K_KEY).cipher_name == "aes256k"


def test_keys_made_by_ceph_authtool_parse() -> None:
    """Keys printed by Pacific's and Tentacle's `ceph-authtool --gen-print-key` (secrets of no cluster)."""
    assert cephx_keys.inspect("AQCeNQlrULPDMRAAATM2h68XiRrweF6ColwfRg==").cipher_name == "aes"
    assert cephx_keys.inspect("AgD4MwlrfM6WAiAAYpsiSPOuQb8QNWa49od0cmF9D1KI+K0YlLNhzA9iVOw=").cipher_name == "aes256k"


def test_a_longer_secret_is_read_as_ceph_reads_it() -> None:
    """Ceph's validate_secret accepts secrets longer than the cipher uses; so must we (or a key that
    works would be refused)."""
    assert cephx_keys.inspect(make_key(1, os.urandom(32))).cipher == cephx_keys.AES


@pytest.mark.parametrize(("key", "reason"), [
    ("not base64!", "not base64"),
    ("QUJD", "too short"),
    (make_key(0, os.urandom(16)), "cipher type is 0"),
    (make_key(3, os.urandom(32)), "cipher type is 3"),
    (make_key(1, os.urandom(16), declared=17), "length does not fit its aes header"),
    (make_key(2, os.urandom(32))[:-4], "length does not fit its aes256k header"),  # cut when copied
    (make_key(2, os.urandom(16)), "aes256k secret is 16 bytes"),
    (make_key(1, os.urandom(8)), "aes secret is 8 bytes"),
])
def test_what_is_not_a_key_is_invalid_argument_naming_the_field_not_the_key(key: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        cephx_keys.inspect(key, "userKey")
    message = caught.value.message
    assert message.startswith("secrets userKey is not a cephx key") and reason in message
    assert key not in message
    assert not is_cephx_key(key)


def test_an_aes256k_key_on_a_client_that_cannot_read_it_names_the_cipher_the_client_and_both_ways_out() -> None:
    with pytest.raises(FailedPrecondition) as caught:
        cephx_keys.check_usable(cephx_keys.inspect(AES256K_KEY), OLD)
    message = caught.value.message
    assert AES256K_KEY not in message
    assert "aes256k" in message and "librados 16.2.15" in message
    assert "Tentacle 20.2.4 or newer libraries" in message  # way out 1: a newer client
    for command in ("ceph config set mon mon_auth_allow_insecure_key true",  # way out 2: a legacy key
                    "ceph mon set auth_allowed_ciphers aes256k,aes",
                    "ceph auth get-or-create client.<id>", "--key-type aes"):
        assert command in message
    assert "check the secret" not in message  # the key is fine: never send the operator to it


def test_what_every_client_reads_passes() -> None:
    cephx_keys.check_usable(cephx_keys.inspect(AES_KEY), OLD)
    cephx_keys.check_usable(cephx_keys.inspect(AES_KEY), NEW)
    cephx_keys.check_usable(cephx_keys.inspect(AES256K_KEY), NEW)


def test_an_unknown_client_version_is_said_so() -> None:
    with pytest.raises(FailedPrecondition, match=r"librados \(version unknown\)"):
        cephx_keys.check_usable(cephx_keys.inspect(AES256K_KEY), cephx_keys.Client("librados", None, False))


def test_a_refused_aes_key_points_at_the_clusters_allowed_ciphers_first() -> None:
    hint = cephx_keys.refusal_hint(cephx_keys.inspect(AES_KEY), OLD)
    assert hint.index("auth_allowed_ciphers") < hint.index("userID/userKey")
    assert "legacy aes" in hint and "16.2.15" in hint
    assert "aes256k cephx key" in cephx_keys.refusal_hint(cephx_keys.inspect(AES256K_KEY), NEW)


def test_forms_are_every_text_a_tool_could_print_for_the_key() -> None:
    raw = base64.b64decode(AES256K_KEY)
    secret = raw[12:]
    forms = cephx_keys.forms(AES256K_KEY)
    assert AES256K_KEY in forms
    assert base64.b64encode(secret).decode() in forms
    assert secret.hex() in forms and secret.hex().upper() in forms
    assert cephx_keys.forms("hunter2") == ("hunter2",)


@pytest.mark.parametrize(("text", "version"), [
    ("ceph version 16.2.15 (618f440892089921c3e944a991122ddc44e60516) pacific (stable)", "16.2.15"),
    ("ceph version 20.2.4 (7f79373) tentacle (stable - RelWithDebInfo)", "20.2.4"),
    ("18.2.7", "18.2.7"),
    ("rbd: unknown", None),
])
def test_parse_version(text: str, version: str | None) -> None:
    assert cephx_keys.parse_version(text) == version


def test_the_hosts_librados_is_asked_its_own_version_and_cipher_support() -> None:
    """The probe against the library this process loaded (Pacific 16.2.15 on the dev machines,
    whatever the image ships elsewhere): the version is Ceph's, not librados' API version 3.0.0."""
    client = cephx_keys.library_client()
    version = client.version
    assert version is not None and not version.startswith("3.0")
    major = int(version.split(".")[0])
    assert client.reads_aes256k == (major >= 20), client


def test_credentials_refuse_a_malformed_key_but_take_an_aes256k_one() -> None:
    assert Credentials.from_secrets({"userID": "csi", "userKey": AES256K_KEY}).key_info.cipher == cephx_keys.AES256K
    with pytest.raises(InvalidArgument, match="userKey is not a cephx key"):
        Credentials.from_secrets({"userID": "csi", "userKey": make_key(2, os.urandom(16))})


def _session_error(opener: Opener | None, key: str) -> Exception:
    cache = ConnectionCache(CephSettings(mount_timeout=1.0)) if opener is None else \
        ConnectionCache(CephSettings(mount_timeout=1.0), opener=opener)
    with pytest.raises(Exception) as caught:
        with cache.session(ClusterConfig("c1", ("127.0.0.1:1",)), Credentials("csi", key)) as session:
            session.rados
    return caught.value


def test_the_connection_passes_the_refusal_of_an_unreadable_key_through_unchanged() -> None:
    """open_rados refuses before librados sees the key; the connection must not turn that into INTERNAL."""
    if cephx_keys.library_client().reads_aes256k:
        pytest.skip("this host's librados reads aes256k keys")
    error = _session_error(None, AES256K_KEY)
    assert isinstance(error, FailedPrecondition) and "cannot read aes256k keys" in str(error)


def test_a_connect_timeout_with_an_aes_key_names_the_cipher_situation() -> None:
    def times_out(_cluster: ClusterConfig, _credentials: Credentials, _settings: CephSettings) -> rados.Rados:
        raise rados.TimedOut("error connecting to the cluster", errno=110)

    message = str(_session_error(times_out, AES_KEY))
    assert "Either the monitors are unreachable" in message and "legacy aes cephx key" in message
    assert "auth_allowed_ciphers" in message and AES_KEY not in message
