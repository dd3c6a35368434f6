"""Check that a cephx key is well formed before any tool sees it.

Ceph tools echo a key they cannot decode into their stderr and log files ("failed to decode
key '<the key>'"); refusing a malformed key up front keeps it out of both. A well-formed but
wrong key only yields "permission denied", without the key.

The encoded form (CryptoKey::encode) is: u16 type, u32+u32 creation time, u16 secret length,
then the secret; base64 of that is what `ceph auth get-key` prints.
"""
from __future__ import annotations

import base64
import binascii
import struct

from cephcsi.errors import InvalidArgument


def check_key(key: str) -> None:
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("secret userKey is not a base64 cephx key (as printed by `ceph auth get-key`)") from None
    if len(raw) < 12:
        raise InvalidArgument("secret userKey is too short to be a cephx key (as printed by `ceph auth get-key`)")
    key_type, _sec, _nsec, length = struct.unpack_from("<HIIH", raw)
    if key_type == 0 or length == 0 or len(raw) != 12 + length:
        raise InvalidArgument("secret userKey is not a valid cephx key (as printed by `ceph auth get-key`)")
