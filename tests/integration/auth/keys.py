"""cephx keys for the auth tests, and a search for any trace of them in files.

`aes256k_key()` is a real one when a Tentacle root is built (tests/ceph/releases.sh: its
ceph-authtool makes it), else one laid out as Ceph encodes keys (src/auth/Crypto.h) with a random
secret: either way a Pacific or Reef client cannot decode it, which is all these tests need
without a Tentacle cluster.
"""
from __future__ import annotations

import base64
import os
import pathlib
import struct
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass

from cephcsi.ceph import cephx_keys

RELEASES = pathlib.Path(__file__).resolve().parents[2] / "ceph" / "releases.sh"
_HEADER_CHARS = 16
"""The base64 of a key's 12-byte header (type, creation time, length): shared by many keys."""
_WINDOW = 12
"""Any 12 characters of a key's secret-bearing text count as a leak (72 bits of base64)."""


def tentacle_root() -> str | None:
    if not RELEASES.exists():
        return None
    found = subprocess.run([str(RELEASES), "path", "tentacle"], capture_output=True, text=True, check=False)
    root = found.stdout.strip()
    return root if found.returncode == 0 and root and os.path.isdir(root) else None


def aes256k_key() -> tuple[str, str]:
    """(key, where it came from)."""
    root = tentacle_root()
    if root is not None:
        made = subprocess.run(["chroot", root, "ceph-authtool", "--gen-print-key"],
                              capture_output=True, text=True, check=False, timeout=60)
        key = made.stdout.strip()
        if made.returncode == 0 and key.startswith("Ag"):
            return key, f"ceph-authtool of Tentacle ({root})"
    secret = os.urandom(32)
    raw = struct.pack("<HIIH", cephx_keys.AES256K, int(time.time()), 0, len(secret)) + secret
    return base64.b64encode(raw).decode(), "laid out as Ceph's CryptoKey::encode (no Tentacle root built)"


def fragments(key: str) -> set[str]:
    """Every 12-character run of every form of `key` that carries its secret."""
    found: set[str] = set()
    for form in cephx_keys.forms(key):
        body = form[_HEADER_CHARS:] if form.startswith(key[:2]) and len(form) == len(key) else form
        found |= {body[i:i + _WINDOW] for i in range(max(1, len(body) - _WINDOW + 1))}
    return found


@dataclass(frozen=True)
class Leak:
    path: str
    key_name: str
    fragment: str

    def __str__(self) -> str:  # never the fragment itself: the report would leak it again
        return f"{self.path} holds part of {self.key_name}"


def files_under(paths: Iterable[str]) -> list[str]:
    """Regular files under `paths`, not descending into mount points: an rbd-fuse mount there
    holds the image itself (data, not a log, and reading it all would take seconds)."""
    found: list[str] = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
        for folder, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(folder, d))]
            found += [os.path.join(folder, name) for name in names if os.path.isfile(os.path.join(folder, name))]
    return sorted(set(found))


def find_leaks(paths: Iterable[str], keys: dict[str, str]) -> list[Leak]:
    """Every file under `paths` holding a fragment of one of `keys` (name → key)."""
    searched = {name: fragments(key) for name, key in keys.items()}
    leaks: list[Leak] = []
    for path in files_under(paths):
        try:
            text = pathlib.Path(path).read_bytes().decode("latin-1")
        except OSError:
            continue  # gone meanwhile (a socket, a removed temp file)
        for name, pieces in searched.items():
            hit = next((piece for piece in pieces if piece in text), None)
            if hit is not None:
                leaks.append(Leak(path, name, hit))
    return leaks
