"""Ceph's wire encoding (src/include/encoding.h), for the few object-class requests and replies
cephcsi builds and reads itself because the Python bindings have no call for them (cls_lock in
one write op with omap steps, cls_rbd trash states and parent links, raw omap values of
librbd's own objects). Little endian; a string is a u32 length and its bytes; a versioned
struct (ENCODE_START) is u8 version, u8 compat version, u32 length, then its body.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from cephcsi.errors import Internal

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


class UnknownEncoding(Internal):
    """A structure librbd or cls_rbd wrote in an encoding this driver does not know (a newer
    compat version, a truncated value, an enum value it has never seen). Callers fall back to
    librbd, or refuse with this message; they never guess at a newer layout."""


@dataclass(frozen=True)
class Struct:
    """Where a versioned struct's body lies in its buffer (ENCODE_START's header read)."""

    version: int
    start: int
    end: int


def read_versioned(raw: bytes, what: str, known: int, offset: int = 0) -> Struct:
    """The struct at `offset`, checked as Ceph's DECODE_START checks it: readable when its
    compat version is at most `known` (the newest version this driver decodes); a newer
    version's extra fields lie after the known ones and are skipped by the length. Raises
    UnknownEncoding for a newer compat or a body the buffer does not hold."""
    if len(raw) < offset + STRUCT_HEADER:
        raise UnknownEncoding(f"{what}: {len(raw) - offset} bytes, shorter than an encoded struct's header")
    version, compat, length = struct.unpack_from("<BBI", raw, offset)
    if compat > known:
        raise UnknownEncoding(f"{what} is encoded as version {version} (compat {compat}); this driver reads up to "
                              f"version {known}: a newer Ceph wrote it, so librbd handles it")
    start = offset + STRUCT_HEADER
    if start + length > len(raw):
        raise UnknownEncoding(f"{what}: the encoded struct claims {length} bytes, the value holds {len(raw) - start}")
    return Struct(version, start, start + length)


def read_string_within(raw: bytes, offset: int, end: int, what: str) -> tuple[str, int]:
    """`read_string`, refusing a string that runs past `end` (the struct's body)."""
    if offset + 4 > end:
        raise UnknownEncoding(f"{what}: a string's length runs past the struct")
    (length,) = struct.unpack_from("<I", raw, offset)
    if offset + 4 + length > end:
        raise UnknownEncoding(f"{what}: a string of {length} bytes runs past the struct")
    return read_string(raw, offset)


def require(raw: bytes, offset: int, size: int, end: int, what: str) -> None:
    """Refuse a fixed-size field at `offset` that does not fit before `end`."""
    if offset + size > min(end, len(raw)):
        raise UnknownEncoding(f"{what}: the value ends before its fields do")
