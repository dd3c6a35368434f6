"""google/fscrypt's metadata records (its metadata.proto, proto3) encoded and decoded by hand.

Only the wire types those records use: varint (0) and length-delimited (2). Fields are written in
field-number order and proto3 defaults (0, empty) are left out, as Go's marshaller does, so a
record written here is byte-for-byte what google/fscrypt would write for the same values. Unknown
fields are skipped on read (a newer fscrypt may add some).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from cephcsi.errors import FailedPrecondition

# SourceType
SOURCE_CUSTOM_PASSPHRASE = 2
SOURCE_RAW_KEY = 3
# EncryptionOptions.Mode (the kernel's FSCRYPT_MODE_* numbers)
MODE_AES_256_XTS = 1
MODE_AES_256_CTS = 4


class BadRecord(FailedPrecondition):
    pass


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives are ten-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _bytes_field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value if value else b""


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    pos = 0

    def read_varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(data) or shift > 63:
                raise BadRecord("fscrypt metadata record is truncated or not protobuf")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while pos < len(data):
        key = read_varint()
        number, kind = key >> 3, key & 7
        if kind == 0:
            yield number, read_varint()
        elif kind == 2:
            size = read_varint()
            if pos + size > len(data):
                raise BadRecord("fscrypt metadata record is truncated")
            yield number, data[pos:pos + size]
            pos += size
        elif kind == 1:
            pos += 8
        elif kind == 5:
            pos += 4
        else:
            raise BadRecord(f"fscrypt metadata record has an unsupported wire type {kind}")


def _as_int(value: int | bytes) -> int:
    if isinstance(value, bytes):
        raise BadRecord("fscrypt metadata record: a number field holds bytes")
    return value - (1 << 64) if value >= 1 << 63 else value


def _as_bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise BadRecord("fscrypt metadata record: a bytes field holds a number")
    return value


@dataclass(frozen=True)
class HashingCosts:
    time: int
    memory: int
    parallelism: int
    truncation_fixed: bool = False

    def encode(self) -> bytes:
        return (_int_field(2, self.time) + _int_field(3, self.memory) + _int_field(4, self.parallelism)
                + _int_field(5, int(self.truncation_fixed)))

    @classmethod
    def decode(cls, data: bytes) -> HashingCosts:
        values: dict[int, int] = {}
        for number, value in _fields(data):
            if number in (2, 3, 4, 5):
                values[number] = _as_int(value)
        return cls(values.get(2, 0), values.get(3, 0), values.get(4, 0), bool(values.get(5, 0)))


@dataclass(frozen=True)
class WrappedKey:
    iv: bytes
    encrypted_key: bytes
    hmac: bytes

    def encode(self) -> bytes:
        return _bytes_field(1, self.iv) + _bytes_field(2, self.encrypted_key) + _bytes_field(3, self.hmac)

    @classmethod
    def decode(cls, data: bytes) -> WrappedKey:
        values = {number: _as_bytes(value) for number, value in _fields(data) if number in (1, 2, 3)}
        return cls(values.get(1, b""), values.get(2, b""), values.get(3, b""))


@dataclass(frozen=True)
class Protector:
    descriptor: str
    source: int
    name: str
    wrapped_key: WrappedKey
    costs: HashingCosts | None = None
    salt: bytes = b""
    uid: int = 0

    def encode(self) -> bytes:
        return (_bytes_field(1, self.descriptor.encode()) + _int_field(2, self.source)
                + _bytes_field(3, self.name.encode())
                + (_bytes_field(4, self.costs.encode()) if self.costs else b"")
                + _bytes_field(5, self.salt) + _int_field(6, self.uid)
                + _bytes_field(7, self.wrapped_key.encode()))

    @classmethod
    def decode(cls, data: bytes) -> Protector:
        raw = dict(_fields(data))
        costs = raw.get(4)
        return cls(
            descriptor=_as_bytes(raw.get(1, b"")).decode(errors="replace"),
            source=_as_int(raw.get(2, 0)),
            name=_as_bytes(raw.get(3, b"")).decode(errors="replace"),
            wrapped_key=WrappedKey.decode(_as_bytes(raw.get(7, b""))),
            costs=HashingCosts.decode(_as_bytes(costs)) if costs is not None else None,
            salt=_as_bytes(raw.get(5, b"")),
            uid=_as_int(raw.get(6, 0)),
        )


@dataclass(frozen=True)
class Options:
    padding: int
    contents: int
    filenames: int
    policy_version: int

    def encode(self) -> bytes:
        return (_int_field(1, self.padding) + _int_field(2, self.contents) + _int_field(3, self.filenames)
                + _int_field(4, self.policy_version))

    @classmethod
    def decode(cls, data: bytes) -> Options:
        values = {number: _as_int(value) for number, value in _fields(data) if number in (1, 2, 3, 4)}
        return cls(values.get(1, 0), values.get(2, 0), values.get(3, 0), values.get(4, 0))


@dataclass(frozen=True)
class WrappedPolicyKey:
    protector_descriptor: str
    wrapped_key: WrappedKey

    def encode(self) -> bytes:
        return _bytes_field(1, self.protector_descriptor.encode()) + _bytes_field(2, self.wrapped_key.encode())

    @classmethod
    def decode(cls, data: bytes) -> WrappedPolicyKey:
        raw = dict(_fields(data))
        return cls(_as_bytes(raw.get(1, b"")).decode(errors="replace"),
                   WrappedKey.decode(_as_bytes(raw.get(2, b""))))


@dataclass(frozen=True)
class Policy:
    key_descriptor: str
    options: Options
    wrapped_keys: tuple[WrappedPolicyKey, ...] = field(default=())

    def encode(self) -> bytes:
        return (_bytes_field(1, self.key_descriptor.encode()) + _bytes_field(2, self.options.encode())
                + b"".join(_bytes_field(3, key.encode()) for key in self.wrapped_keys))

    @classmethod
    def decode(cls, data: bytes) -> Policy:
        descriptor = b""
        options = b""
        keys: list[WrappedPolicyKey] = []
        for number, value in _fields(data):
            if number == 1:
                descriptor = _as_bytes(value)
            elif number == 2:
                options = _as_bytes(value)
            elif number == 3:
                keys.append(WrappedPolicyKey.decode(_as_bytes(value)))
        return cls(descriptor.decode(errors="replace"), Options.decode(options), tuple(keys))
