"""google/fscrypt's key handling: how a protector key wraps a policy key, how a passphrase or raw
key wraps a protector key, and how descriptors are named.

Byte-compatible with google/fscrypt (and so with ceph-csi); the algorithms are listed in
docs/design/node.md, "fscrypt: file encryption".
"""
from __future__ import annotations

import hashlib
import hmac
import os

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from cephcsi.node.fscrypt.wire import HashingCosts, WrappedKey

INTERNAL_KEY_LEN = 32
POLICY_KEY_LEN = 64
IV_LEN = 16
SALT_LEN = 16


class BadKey(Exception):
    """The key does not open this wrapped key (its HMAC does not match)."""


def _stretch(wrapping_key: bytes) -> tuple[bytes, bytes]:
    if len(wrapping_key) != INTERNAL_KEY_LEN:
        raise BadKey(f"a wrapping key is {INTERNAL_KEY_LEN} bytes, not {len(wrapping_key)}")
    both = HKDF(algorithm=hashes.SHA256(), length=2 * INTERNAL_KEY_LEN, salt=None, info=None).derive(wrapping_key)
    return both[:INTERNAL_KEY_LEN], both[INTERNAL_KEY_LEN:]


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    encryptor = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return encryptor.update(data) + encryptor.finalize()


def wrap(wrapping_key: bytes, secret: bytes) -> WrappedKey:
    enc_key, auth_key = _stretch(wrapping_key)
    iv = os.urandom(IV_LEN)
    encrypted = _ctr(enc_key, iv, secret)
    return WrappedKey(iv=iv, encrypted_key=encrypted, hmac=hmac.new(auth_key, iv + encrypted, "sha256").digest())


def unwrap(wrapping_key: bytes, wrapped: WrappedKey) -> bytes:
    enc_key, auth_key = _stretch(wrapping_key)
    expected = hmac.new(auth_key, wrapped.iv + wrapped.encrypted_key, "sha256").digest()
    if len(wrapped.iv) != IV_LEN or not hmac.compare_digest(expected, wrapped.hmac):
        raise BadKey("key authentication check failed")
    return _ctr(enc_key, wrapped.iv, wrapped.encrypted_key)


def protector_descriptor(protector_key: bytes) -> str:
    return hashlib.sha512(hashlib.sha512(protector_key).digest()).digest()[:8].hex()


def policy_descriptor_v2(policy_key: bytes) -> str:
    return HKDF(algorithm=hashes.SHA512(), length=16, salt=None, info=b"fscrypt\x00\x01").derive(policy_key).hex()


def passphrase_hash(passphrase: bytes, salt: bytes, costs: HashingCosts) -> bytes:
    # Before truncation_fixed, google/fscrypt passed parallelism to Go's argon2 as a uint8.
    lanes = costs.parallelism if costs.truncation_fixed else costs.parallelism & 0xFF
    return Argon2id(salt=salt, length=INTERNAL_KEY_LEN, iterations=costs.time, lanes=lanes,
                    memory_cost=costs.memory).derive(passphrase)


def raw_key(passphrase: str) -> bytes:
    """The 32-byte raw key ceph-csi uses for a KMS-kept passphrase: its bytes, cut or NUL-padded
    to 32. ceph-csi first tries the passphrase at its own length, which google/fscrypt accepts only
    when it is exactly 32 bytes (then both are the same key), and falls back to this fitted key."""
    return passphrase.encode()[:INTERNAL_KEY_LEN].ljust(INTERNAL_KEY_LEN, b"\x00")
