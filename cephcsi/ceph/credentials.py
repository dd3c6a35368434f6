"""cephx credentials from CSI request secrets, and short-lived key files for the CLI tools.

A key never goes on a command line (visible in /proc/*/cmdline) or into a log line: librados
gets it through its in-memory config, `rbd`/`rbd-nbd`/`rbd-fuse` through a 0600 file that is
removed as soon as the command has read it.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from cephcsi.ceph import cephx_keys
from cephcsi.errors import InvalidArgument

USER_ID_KEY = "userID"
USER_KEY_KEY = "userKey"


@dataclass(frozen=True)
class Credentials:
    user_id: str
    key: str = field(repr=False)

    @classmethod
    def from_secrets(cls, secrets: Mapping[str, str]) -> Credentials:
        user_id = secrets.get(USER_ID_KEY, "")
        key = secrets.get(USER_KEY_KEY, "")
        missing = [name for name, value in ((USER_ID_KEY, user_id), (USER_KEY_KEY, key)) if not value]
        if missing:
            raise InvalidArgument(
                f"secrets must contain {' and '.join(missing)} (the cephx user without 'client.' and its key)"
            )
        if user_id.startswith("client."):
            user_id = user_id[len("client."):]
        if not user_id or any(c.isspace() or c in "/[]" for c in user_id):
            raise InvalidArgument("secrets userID is not a valid cephx user name")
        # librados prints a key it cannot decode to stderr, so a malformed key must never
        # reach it; the message does not echo the key either (cephcsi.ceph.cephx_keys).
        cephx_keys.inspect(key, USER_KEY_KEY)
        return cls(user_id, key)

    @property
    def key_info(self) -> cephx_keys.KeyInfo:
        """The key's cipher (checked well-formed when the credentials were built)."""
        return cephx_keys.inspect(self.key, USER_KEY_KEY)

    @property
    def fingerprint(self) -> str:
        """Distinguishes keys (for connection caching after a key rotation) without revealing them."""
        return hashlib.sha256(f"{self.user_id}\0{self.key}".encode()).hexdigest()[:16]


def is_cephx_key(key: str) -> bool:
    """A well-formed aes or aes256k key (see cephcsi.ceph.cephx_keys)."""
    try:
        cephx_keys.inspect(key)
    except InvalidArgument:
        return False
    return True


@contextmanager
def key_file(credentials: Credentials, directory: str | None = None) -> Iterator[str]:
    """A 0600 file holding only the key (for `--keyfile`), removed on exit."""
    fd, path = tempfile.mkstemp(prefix="cephcsi-key-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, credentials.key.encode())
        os.close(fd)
        yield path
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
