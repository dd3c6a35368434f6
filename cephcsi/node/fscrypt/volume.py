"""A staged filesystem's encrypted directory in ceph-csi's layout: `<staging>/ceph-csi-encrypted`
with a v2 policy whose key is wrapped by one protector named "ceph-csi".

unlock() is idempotent and completes whatever a killed earlier call left; a directory with a
policy always has the record that opens it. docs/design/node.md, "fscrypt: file encryption".
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from cephcsi.errors import FailedPrecondition, PermissionDenied
from cephcsi.node.fscrypt import ioctls, keys
from cephcsi.node.fscrypt.metadata_dir import MetadataDir
from cephcsi.node.fscrypt.wire import (
    MODE_AES_256_CTS,
    MODE_AES_256_XTS,
    SOURCE_CUSTOM_PASSPHRASE,
    SOURCE_RAW_KEY,
    HashingCosts,
    Options,
    Policy,
    Protector,
    WrappedPolicyKey,
)

ENCRYPTED_DIR = "ceph-csi-encrypted"
PROTECTOR_NAME = "ceph-csi"
OPTIONS = Options(padding=32, contents=MODE_AES_256_XTS, filenames=MODE_AES_256_CTS, policy_version=2)
# ceph-csi calibrates Argon2id to ~1 s per node; fixed costs of that order keep a protector made
# here openable on a small node and by `fscrypt unlock` (the costs are kept in the record).
NEW_COSTS = HashingCosts(time=4, memory=64 * 1024, parallelism=1)


@dataclass(frozen=True)
class ProtectorSecret:
    """What opens the volume's protector; the passphrase never leaves this process."""
    source: int
    passphrase: str

    @classmethod
    def raw(cls, passphrase: str) -> ProtectorSecret:
        return cls(SOURCE_RAW_KEY, passphrase)

    @classmethod
    def custom_passphrase(cls, passphrase: str) -> ProtectorSecret:
        return cls(SOURCE_CUSTOM_PASSPHRASE, passphrase)

    def wrapping_key(self, protector: Protector) -> bytes:
        return self.key_for(protector.source, protector.costs, protector.salt)

    def key_for(self, source: int, costs: HashingCosts | None, salt: bytes) -> bytes:
        if source == SOURCE_RAW_KEY:
            return keys.raw_key(self.passphrase)
        if costs is None or len(salt) != keys.SALT_LEN:
            raise FailedPrecondition("an fscrypt passphrase protector has no hashing costs or salt")
        return keys.passphrase_hash(self.passphrase.encode(), salt, costs)


def encrypted_dir(staging_path: str) -> str:
    return os.path.join(staging_path, ENCRYPTED_DIR)


def _open_protector(protector: Protector, secret: ProtectorSecret) -> bytes:
    if protector.source != secret.source:
        raise PermissionDenied(f"fscrypt protector {PROTECTOR_NAME!r} ({protector.descriptor}) is of source "
                               f"{protector.source}, not the {secret.source} this volume's KMS gives")
    try:
        return keys.unwrap(secret.wrapping_key(protector), protector.wrapped_key)
    except keys.BadKey as e:
        raise PermissionDenied(f"the volume's passphrase does not open fscrypt protector {PROTECTOR_NAME!r} "
                               f"({protector.descriptor})") from e


def _new_protector(secret: ProtectorSecret) -> tuple[Protector, bytes]:
    protector_key = os.urandom(keys.INTERNAL_KEY_LEN)
    descriptor = keys.protector_descriptor(protector_key)
    costs = NEW_COSTS if secret.source == SOURCE_CUSTOM_PASSPHRASE else None
    salt = os.urandom(keys.SALT_LEN) if costs else b""
    wrapping = secret.key_for(secret.source, costs, salt)
    return Protector(descriptor=descriptor, source=secret.source, name=PROTECTOR_NAME,
                     wrapped_key=keys.wrap(wrapping, protector_key), costs=costs, salt=salt), protector_key


def _named_protector(meta: MetadataDir, descriptors: list[str] | None = None) -> Protector | None:
    candidates = [p for p in meta.protectors() if p.name == PROTECTOR_NAME
                  and (descriptors is None or p.descriptor in descriptors)]
    if len(candidates) > 1:
        raise FailedPrecondition(f"{meta.base} has {len(candidates)} fscrypt protectors named {PROTECTOR_NAME!r}; "
                                 "keep the one that opens the volume")
    return candidates[0] if candidates else None


def _policy_key(policy: Policy, protector: Protector, protector_key: bytes) -> bytes:
    for wrapped in policy.wrapped_keys:
        if wrapped.protector_descriptor == protector.descriptor:
            try:
                return keys.unwrap(protector_key, wrapped.wrapped_key)
            except keys.BadKey as e:
                raise FailedPrecondition(f"fscrypt policy {policy.key_descriptor}: its key wrapped for "
                                         f"protector {protector.descriptor} is damaged") from e
    raise FailedPrecondition(f"fscrypt policy {policy.key_descriptor} is not protected by {PROTECTOR_NAME!r}")


def _unlock_existing(mount_point: str, meta: MetadataDir, kernel: ioctls.KernelPolicy, secret: ProtectorSecret) -> None:
    policy = meta.policy(kernel.identifier)
    if policy is None:
        raise FailedPrecondition(f"{encrypted_dir(mount_point)} is encrypted with key {kernel.identifier}, but "
                                 f"{meta.base} has no record of it: the volume cannot be opened")
    protector = _named_protector(meta, [w.protector_descriptor for w in policy.wrapped_keys])
    if protector is None:
        raise FailedPrecondition(f"fscrypt policy {policy.key_descriptor} has no protector named {PROTECTOR_NAME!r}")
    policy_key = _policy_key(policy, protector, _open_protector(protector, secret))
    ioctls.add_key(mount_point, policy_key)


def _set_up(mount_point: str, meta: MetadataDir, directory: str, secret: ProtectorSecret) -> None:
    protector = _named_protector(meta)
    if protector is None:
        protector, protector_key = _new_protector(secret)
        meta.write_protector(protector)
    else:
        protector_key = _open_protector(protector, secret)
    # A kill after the policy record but before the kernel policy left a record to reuse.
    existing = [p for p in meta.policies() if p.options == OPTIONS
                and any(w.protector_descriptor == protector.descriptor for w in p.wrapped_keys)]
    if existing:
        policy = existing[0]
        policy_key = _policy_key(policy, protector, protector_key)
    else:
        policy_key = os.urandom(keys.POLICY_KEY_LEN)
        policy = Policy(key_descriptor=keys.policy_descriptor_v2(policy_key), options=OPTIONS,
                        wrapped_keys=(WrappedPolicyKey(protector.descriptor, keys.wrap(protector_key, policy_key)),))
        meta.write_policy(policy)
    identifier = ioctls.add_key(mount_point, policy_key)
    if identifier != policy.key_descriptor:
        raise FailedPrecondition(f"fscrypt policy record {policy.key_descriptor} does not match its key "
                                 f"({identifier})")
    ioctls.set_policy(directory, ioctls.KernelPolicy(OPTIONS.contents, OPTIONS.filenames, OPTIONS.padding,
                                                     policy.key_descriptor))
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlock(mount_point: str, secret: ProtectorSecret, read_only: bool = False) -> str:
    """Set up (first stage) or open the encrypted directory of the filesystem mounted at
    mount_point; returns its path. A read-only mount is only ever opened."""
    directory = encrypted_dir(mount_point)
    meta = MetadataDir(mount_point)
    if not read_only:
        meta.ensure()
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass
    kernel = ioctls.get_policy(directory) if os.path.isdir(directory) else None
    if kernel is not None:
        _unlock_existing(mount_point, meta, kernel, secret)
    elif read_only:
        raise FailedPrecondition(f"{directory} is not set up for encryption and the volume is staged read-only; "
                                 "stage it read-write once first (a read-only stage never writes)")
    else:
        _set_up(mount_point, meta, directory, secret)
    return directory


def lock(mount_point: str) -> None:
    """Remove the directory's key from the filesystem keyring (before the unmount); nothing to do
    when the directory or its policy is absent."""
    directory = encrypted_dir(mount_point)
    try:
        kernel = ioctls.get_policy(directory)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return
        raise
    if kernel is not None:
        ioctls.remove_key(mount_point, kernel.identifier)


def is_set_up(mount_point: str) -> bool:
    directory = encrypted_dir(mount_point)
    return os.path.isdir(directory) and ioctls.get_policy(directory) is not None


def is_unlocked(mount_point: str) -> bool:
    directory = encrypted_dir(mount_point)
    try:
        kernel = ioctls.get_policy(directory)
    except FileNotFoundError:
        return False
    return kernel is not None and ioctls.key_present(mount_point, kernel.identifier)
