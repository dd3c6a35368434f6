"""The `.fscrypt` directory at the root of a filesystem, as google/fscrypt lays it out
(`protectors/<descriptor>`, `policies/<descriptor>`, one 0600 protobuf record per file).

Every write is atomic (build in `.tmp*`, fsync, rename): a kill leaves the old state or the new.
docs/design/node.md, "fscrypt: file encryption".
"""
from __future__ import annotations

import os
import tempfile

from cephcsi.node.fscrypt.wire import BadRecord, Policy, Protector

BASE = ".fscrypt"
POLICIES = "policies"
PROTECTORS = "protectors"
TEMP_PREFIX = ".tmp"
DIR_MODE = 0o755
FILE_MODE = 0o600


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MetadataDir:
    def __init__(self, mount_point: str) -> None:
        self.mount_point = mount_point
        self.base = os.path.join(mount_point, BASE)

    def exists(self) -> bool:
        return os.path.isdir(self.base)

    def ensure(self) -> None:
        if self.exists():
            return
        temp = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=self.mount_point)
        os.chmod(temp, DIR_MODE)
        for sub in (POLICIES, PROTECTORS):
            os.mkdir(os.path.join(temp, sub), DIR_MODE)
            os.chmod(os.path.join(temp, sub), DIR_MODE)
        _fsync_dir(temp)
        try:
            os.rename(temp, self.base)
        except OSError:
            # Another stage won the race (or .fscrypt appeared): use theirs.
            for sub in (POLICIES, PROTECTORS):
                os.rmdir(os.path.join(temp, sub))
            os.rmdir(temp)
            if not self.exists():
                raise
        _fsync_dir(self.mount_point)

    def _write(self, sub: str, name: str, data: bytes) -> None:
        directory = os.path.join(self.base, sub)
        fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=directory)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, os.path.join(directory, name))
        _fsync_dir(directory)

    def _read(self, sub: str, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.base, sub, name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def _names(self, sub: str) -> list[str]:
        try:
            names = os.listdir(os.path.join(self.base, sub))
        except FileNotFoundError:
            return []
        # .link files point at protectors on other filesystems; ceph-csi never makes them.
        return sorted(n for n in names if not n.startswith(TEMP_PREFIX) and not n.endswith(".link"))

    def protectors(self) -> list[Protector]:
        found = []
        for name in self._names(PROTECTORS):
            data = self._read(PROTECTORS, name)
            if data is not None:
                try:
                    found.append(Protector.decode(data))
                except BadRecord:
                    continue  # a damaged record of someone else's protector must not block ours
        return found

    def protector(self, descriptor: str) -> Protector | None:
        data = self._read(PROTECTORS, descriptor)
        return Protector.decode(data) if data is not None else None

    def write_protector(self, protector: Protector) -> None:
        self._write(PROTECTORS, protector.descriptor, protector.encode())

    def policies(self) -> list[Policy]:
        found = []
        for name in self._names(POLICIES):
            data = self._read(POLICIES, name)
            if data is not None:
                try:
                    found.append(Policy.decode(data))
                except BadRecord:
                    continue
        return found

    def policy(self, descriptor: str) -> Policy | None:
        data = self._read(POLICIES, descriptor)
        return Policy.decode(data) if data is not None else None

    def write_policy(self, policy: Policy) -> None:
        self._write(POLICIES, policy.key_descriptor, policy.encode())
