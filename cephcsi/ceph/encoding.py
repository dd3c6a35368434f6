"""Ceph's wire encoding (src/include/encoding.h), for the few object-class requests and replies
cephcsi builds and reads itself because the Python bindings have no call for them (cls_lock in
one write op with omap steps, cls_rbd trash states and parent links, raw omap values of
librbd's own objects). Little endian; a string is a u32 length and its bytes; a versioned
struct (ENCODE_START) is u8 version, u8 compat version, u32 length, then its body.
"""
from __future__ import annotations

import struct

STRUCT_HEADER = 6
"""Bytes of ENCODE_START before a versioned struct's body."""


def string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw


def string_map(values: dict[str, str]) -> bytes:
    """A map<string, string> (or <string, bufferlist>: a bufferlist is encoded like a string):
    u32 count, then each key and value, in key order as std::map keeps them."""
    return struct.pack("<I", len(values)) + b"".join(string(k) + string(values[k]) for k in sorted(values))


def versioned(body: bytes, version: int = 1, compat: int = 1) -> bytes:
    return struct.pack("<BBI", version, compat, len(body)) + body


def read_string(raw: bytes, offset: int = 0) -> tuple[str, int]:
    """The string at `offset` and the offset just after it."""
    (length,) = struct.unpack_from("<I", raw, offset)
    start = offset + 4
    return raw[start:start + length].decode(errors="replace"), start + length
