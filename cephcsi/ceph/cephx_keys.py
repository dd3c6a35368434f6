"""What a cephx userKey is (cipher `aes` or `aes256k`), read without librados, and whether this
driver's Ceph client can use it: checked before a key reaches librados or a Ceph tool, which would
print an undecodable key on stderr. Messages never quote the key. Design: docs/design/ceph-access.md.
"""
from __future__ import annotations

import base64
import binascii
import ctypes
import functools
import struct
from dataclasses import dataclass

# By name at import: the answer is about the real library, whatever stands in for rados.Rados later.
from rados import Rados as _Rados

from cephcsi.errors import FailedPrecondition, InvalidArgument

NONE, AES, AES256K = 0, 1, 2
CIPHERS = {AES: "aes", AES256K: "aes256k"}
MIN_SECRET_LENGTHS = {AES: 16, AES256K: 32}
"""Ceph makes keys with exactly these secret lengths and, like its CryptoHandler::validate_secret,
reads any key at least this long (the cipher uses the first 16 or 32 bytes)."""
_HEADER = struct.Struct("<HIIH")
# Present in every Ceph client that can read aes256k keys (it came with them in 20.2.4, as the
# monitor option gating legacy keys) and in none before: asking a client's own config schema for
# it answers "can it read aes256k" for backports too, where a version comparison would guess.
AES256K_MARKER_OPTION = "mon_auth_allow_insecure_key"

TROUBLESHOOTING = "docs/troubleshooting.md, 'Tentacle clusters and aes256k keys'"
LEGACY_KEY_COMMANDS = (
    "ceph config set mon mon_auth_allow_insecure_key true; "
    "ceph mon set auth_allowed_ciphers aes256k,aes; "
    "ceph auth get-or-create client.<id> mon 'profile rbd' osd 'profile rbd pool=<pool>' "
    "mgr 'profile rbd pool=<pool>' --key-type aes"
)


@dataclass(frozen=True)
class KeyInfo:
    """What a well-formed key is, without its secret."""

    cipher: int
    secret_length: int

    @property
    def cipher_name(self) -> str:
        return CIPHERS.get(self.cipher, f"unknown type {self.cipher}")


def inspect(key: str, field: str = "userKey") -> KeyInfo:
    """The key's cipher; InvalidArgument naming `field` (never the key) when it is not a cephx key."""
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise _not_a_key(field, "it is not base64") from None
    if len(raw) < _HEADER.size:
        raise _not_a_key(field, "it is too short")
    cipher, _seconds, _nanoseconds, length = _HEADER.unpack_from(raw)
    if cipher not in CIPHERS:
        raise _not_a_key(field, f"its cipher type is {cipher} (1 is aes, 2 is aes256k)")
    if len(raw) != _HEADER.size + length:
        raise _not_a_key(field, f"its length does not fit its {CIPHERS[cipher]} header (cut or padded when copied?)")
    if length < MIN_SECRET_LENGTHS[cipher]:
        raise _not_a_key(field, f"its {CIPHERS[cipher]} secret is {length} bytes, fewer than the "
                                f"{MIN_SECRET_LENGTHS[cipher]} the cipher needs")
    return KeyInfo(cipher, length)


def _not_a_key(field: str, reason: str) -> InvalidArgument:
    return InvalidArgument(
        f"secrets {field} is not a cephx key: {reason}; expected the base64 'key' value of "
        "`ceph auth get client.<user>`, 40 characters starting with AQ (aes) or 60 starting with Ag (aes256k)"
    )


def forms(key: str) -> tuple[str, ...]:
    """Every text form of `key` a Ceph tool could print: as given, as Ceph re-encodes the decoded
    bytes, the secret alone in base64 (what `secret=` of a kernel mount takes) and in hex. For
    scrubbing captured output; a string that is not a key yields just itself."""
    try:
        inspect(key)
    except InvalidArgument:
        return (key,)
    raw = base64.b64decode(key, validate=True)
    secret = raw[_HEADER.size:]
    found = [key, base64.b64encode(raw).decode(), base64.b64encode(secret).decode(), secret.hex(), secret.hex().upper()]
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Client:
    """A Ceph client (librados in this process, or the rbd tools on this node)."""

    what: str
    """How messages name it: "librados", "the rbd tools"."""
    version: str | None
    """Its Ceph version ("16.2.15"), None when it could not be read."""
    reads_aes256k: bool

    def describe(self) -> str:
        return f"{self.what} {self.version or '(version unknown)'}"


def check_usable(key: KeyInfo, client: Client, field: str = "userKey") -> None:
    """Refuse a well-formed key this client cannot decode, before the client sees it.

    FAILED_PRECONDITION, not UNAVAILABLE: nothing transient is wrong and a retry cannot succeed;
    the key is valid and the cluster may be fine, but this deployment's Ceph client must change
    (or the key must) first, which is what the code means. Not INVALID_ARGUMENT either: the
    request is right, and sending the operator to fix the key would be the old wrong advice.
    """
    if key.cipher != AES256K or client.reads_aes256k:
        return
    raise FailedPrecondition(
        f"secrets {field} is an aes256k cephx key (what a Ceph Tentacle 20.2.4 or newer cluster makes by "
        f"default), and this driver's Ceph client, {client.describe()}, cannot read aes256k keys; the key "
        "itself may well be right. Two ways out: run a cephcsi image whose Ceph client reads aes256k "
        "(Ceph Tentacle 20.2.4 or newer libraries), or give the driver a legacy aes key, made on the cluster "
        f"with: {LEGACY_KEY_COMMANDS} (the cluster then warns AUTH_INSECURE_*). See {TROUBLESHOOTING}."
    )


def refusal_hint(key: KeyInfo, client: Client | None = None) -> str:
    """What to say when the monitors refuse a key the client could read: with a legacy aes key
    the cluster's allowed ciphers are the likelier cause, before the key itself."""
    by = f" (client: {client.describe()})" if client is not None else ""
    if key.cipher == AES:
        return (
            f"The key is a legacy aes cephx key{by}: a Ceph Tentacle 20.2.4 or newer "
            "cluster refuses aes keys unless `ceph mon set auth_allowed_ciphers aes256k,aes` allows them, so check "
            "that first (`ceph mon dump` shows auth_allowed_ciphers), then check the secret's userID/userKey; or give the "
            "driver the user's aes256k key with a client that reads aes256k (Ceph Tentacle 20.2.4 or newer). "
            f"See {TROUBLESHOOTING}."
        )
    return (f"The key is a well-formed aes256k cephx key{by}, which only a Ceph "
            "Tentacle 20.2.4 or newer cluster knows: check the secret's userID/userKey against this cluster's "
            f"`ceph auth get client.<id>`. See {TROUBLESHOOTING}.")


def parse_version(text: str) -> str | None:
    """"16.2.15" from `ceph version 16.2.15 (618f…) pacific (stable)` or from a bare version."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 3 and all(part.isdigit() for part in parts[:3]):
            return word
    return None


@functools.lru_cache(maxsize=1)
def library_client() -> Client:
    """This process's librados: its Ceph version and whether it reads aes256k keys (asked once)."""
    handle = _Rados(conf={})
    try:
        # The binding answers None for an option the library does not know.
        reads = handle.conf_get(AES256K_MARKER_OPTION) is not None
    finally:
        handle.shutdown()
    return Client("librados", _library_version(), reads)


def _library_version() -> str | None:
    """Ceph's own version of the libceph-common librados loaded (librados' rados_version is its
    API version, 3.0.0 on every release): ceph_version_to_str() from common/version.cc."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = [line.split()[-1] for line in maps if "/libceph-common.so" in line]
        if not paths:
            return None
        # The C++ function ceph_version_to_str(), by its mangled name (libceph-common has no C API).
        version_to_str = getattr(ctypes.CDLL(paths[0]), "_Z19ceph_version_to_strv")
        version_to_str.restype = ctypes.c_char_p
        value = version_to_str()
    except (OSError, AttributeError):
        return None
    return parse_version(value.decode(errors="replace")) if isinstance(value, bytes) else None
