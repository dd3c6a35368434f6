"""Probe, create and mount filesystems on mapped devices — without ever reformatting.

mkfs runs only when the device reads cleanly and `blkid -p` finds no signature at all, never
with a force flag; anything else on the device is FAILED_PRECONDITION and left untouched.
mkfs defaults are ceph-csi's; XFS mounts with `nouuid`. Why: docs/design/node.md, "Never reformat".
"""
from __future__ import annotations

import logging
import shlex
import uuid as uuidlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cephcsi.errors import FailedPrecondition, Internal, InvalidArgument
from cephcsi.node import devices
from cephcsi.node.exec import Runner
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

DEFAULT_MKFS_OPTIONS = {
    "ext4": ["-m0", "-Enodiscard,lazy_itable_init=1,lazy_journal_init=1"],
    "xfs": ["-K"],
}
FS_MOUNT_OPTIONS = {"ext4": [], "xfs": ["nouuid"]}
# Read-only mounts never replay a journal: replay writes to the device (refused on a read-only
# mapping, or silently racing the writer's view when several nodes read one image).
READ_ONLY_MOUNT_OPTIONS = {"ext4": ["noload"], "xfs": ["norecovery"]}
# Always on: the volume sits on network storage, so shutdown must unmount it before the
# network goes (systemd reads this from utab for mounts it did not create).
COMMON_MOUNT_OPTIONS = ["_netdev"]
# The tools' getopt strings (e2fsprogs 1.47, xfsprogs 6.1): needed to tell an option's value
# from a flag, so that "-L -F" (a label) is not taken for a force and "-qF" is.
_GETOPT = {
    "ext4": "b:cd:e:g:i:jl:m:no:qr:s:t:vC:DE:FG:I:J:KL:M:N:O:R:ST:U:Vz:",
    "xfs": "b:c:d:i:l:L:m:n:KNp:qr:s:CfV",
}
_FORCE_FLAG = {"ext4": "F", "xfs": "f"}


@dataclass(frozen=True)
class Probe:
    fs_type: str
    """Filesystem type found ('' when none)."""
    other: str
    """Any other signature found (partition table, RAID member...), '' when none."""
    uuid: str = ""
    """The filesystem's UUID as blkid reports it ('' when none)."""

    @property
    def empty(self) -> bool:
        return not self.fs_type and not self.other


def parse_blkid_export(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def probe(runner: Runner, device: str, timeout: float) -> Probe:
    devices.read_probe(device)
    # Exit 2: nothing found. Other non-zero codes (e.g. 8, ambivalent result: several
    # signatures) mean something is there, which we must not format over.
    result = runner(
        ["blkid", "-p", "-o", "export", device], what=f"probe {device} for a filesystem", timeout=timeout, ok_codes=(0, 2, 8)
    )
    if result.returncode == 2:
        if result.stderr.strip():
            raise Internal(f"probing {device} failed: {result.stderr.strip()[:300]}")
        return Probe("", "")
    if result.returncode == 8:
        return Probe("", "several conflicting signatures (blkid: ambivalent result)")
    values = parse_blkid_export(result.stdout)
    usage = values.get("USAGE", "")
    fs_type = values.get("TYPE", "")
    if fs_type and usage in ("", "filesystem"):
        return Probe(fs_type, "", values.get("UUID", ""))
    if values.get("PTTYPE"):
        return Probe("", f"a {values['PTTYPE']} partition table")
    return Probe("", f"{fs_type or 'unknown'} data ({usage or 'unknown usage'})")


def split_options(fs_type: str, tokens: Sequence[str]) -> list[tuple[str, str | None]]:
    """(letter, value or None) for each short option in `tokens`, as the tool's getopt reads
    them. Anything that is not an option is refused: the driver adds the one device itself, and
    a stray word could name another device or a size."""
    takes_value = {c for i, c in enumerate(_GETOPT[fs_type]) if _GETOPT[fs_type][i + 1 : i + 2] == ":"}
    parsed: list[tuple[str, str | None]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("-") or token in ("-", "--") or token.startswith("--"):
            raise InvalidArgument(
                f"mkfsOptions: {token!r} is not a short option of mkfs.{fs_type}; mkfsOptions may hold only "
                "options (the driver adds the device)"
            )
        for position in range(1, len(token)):
            letter = token[position]
            if letter not in takes_value:
                parsed.append((letter, None))
                continue
            value = token[position + 1 :]
            if not value:
                if index >= len(tokens):
                    raise InvalidArgument(f"mkfsOptions: -{letter} of mkfs.{fs_type} needs a value")
                value = tokens[index]
                index += 1
            parsed.append((letter, value))
            break
    return parsed


def _check_user_options(fs_type: str, options: Sequence[str]) -> None:
    for letter, value in split_options(fs_type, options):
        if letter == _FORCE_FLAG[fs_type]:
            raise InvalidArgument(
                f"mkfsOptions must not contain -{letter}: the driver never forces mkfs over existing data. "
                "Remove it from the StorageClass"
            )
        sets_uuid = letter == "U" if fs_type == "ext4" else letter == "m" and _has_suboption(value or "", "uuid")
        if sets_uuid:
            raise InvalidArgument(
                f"mkfsOptions must not set the filesystem UUID (-{letter} {value}): the driver gives each new "
                "filesystem its own UUID to recognise it after an interrupted stage. Remove it from the StorageClass"
            )


def _has_suboption(value: str, name: str) -> bool:
    return any(part.partition("=")[0].strip() == name for part in value.split(","))


def uuid_option(fs_type: str, fs_uuid: str) -> list[str]:
    return ["-U", fs_uuid] if fs_type == "ext4" else ["-m", f"uuid={fs_uuid}"]


def mkfs_argv(fs_type: str, device: str, mkfs_options: str, fs_uuid: str, encrypt: bool = False) -> list[str]:
    """mkfs argv: the user's options (or our defaults), the UUID to give the filesystem, the
    device. Refuses options that would force or set the UUID (INVALID_ARGUMENT). `encrypt`:
    ext4's encrypt feature, which fscrypt needs (ceph-csi adds `-Oencrypt` likewise)."""
    if encrypt and fs_type != "ext4":
        raise InvalidArgument(f"file encryption (fscrypt) needs an ext4 filesystem, not {fs_type}")
    if fs_type not in DEFAULT_MKFS_OPTIONS:
        raise InvalidArgument(f"cannot create filesystem {fs_type!r} (supported: {', '.join(DEFAULT_MKFS_OPTIONS)})")
    if mkfs_options.strip():
        try:
            options = shlex.split(mkfs_options)
        except ValueError as error:
            raise InvalidArgument(f"mkfsOptions {mkfs_options!r} cannot be parsed: {error}") from None
        _check_user_options(fs_type, options)
    else:
        options = list(DEFAULT_MKFS_OPTIONS[fs_type])
    features = ["-O", "encrypt"] if encrypt else []
    return [f"mkfs.{fs_type}", *options, *features, *uuid_option(fs_type, fs_uuid), device]


def ensure_filesystem(
    runner: Runner,
    device: str,
    fs_type: str,
    mkfs_options: str,
    timeout: float,
    on_mkfs_start: Callable[[str], None] | None = None,
    interrupted_uuid: str | None = None,
    volume: str = "",
    encrypt: bool = False,
) -> bool:
    """Make sure `device` holds an `fs_type` filesystem; returns True when we created it.

    mkfs runs only on an empty device. `on_mkfs_start(uuid)` runs after the checks and before
    mkfs, with the UUID mkfs will give the filesystem (the caller records it). `interrupted_uuid`
    is not None when an earlier mkfs of ours on this device may have been cut short: the UUID it
    used ('' if unknown: a record from an older version). It changes no decision — a found
    filesystem of the requested type is kept whoever made it, anything else is refused — only
    what is logged and the advice in the refusal.
    """
    subject = f"volume {volume} (device {device})" if volume else f"device {device}"
    found = probe(runner, device, timeout)
    if found.fs_type == fs_type:
        _log_kept(subject, found, interrupted_uuid)
        return False
    if not found.empty:
        raise FailedPrecondition(_refusal(subject, fs_type, found, interrupted_uuid))
    fs_uuid = str(uuidlib.uuid4())
    argv = mkfs_argv(fs_type, device, mkfs_options, fs_uuid, encrypt)  # options are refused before anything is recorded
    if on_mkfs_start is not None:
        on_mkfs_start(fs_uuid)
    runner(argv, what=f"create {fs_type} filesystem on {subject}", timeout=timeout)
    log.info("filesystem created", extra=fields(device=device, fs_type=fs_type, fs_uuid=fs_uuid, argv=" ".join(argv)))
    return True


def _log_kept(subject: str, found: Probe, interrupted_uuid: str | None) -> None:
    if interrupted_uuid is None:
        log.debug("filesystem found, kept", extra=fields(device=subject, fs_type=found.fs_type, fs_uuid=found.uuid))
        return
    if interrupted_uuid and found.uuid == interrupted_uuid:
        origin = "ours: made by the interrupted mkfs (UUID matches the stage record)"
    elif interrupted_uuid:
        origin = f"not ours: made elsewhere, e.g. by another node (our interrupted mkfs used UUID {interrupted_uuid})"
    else:
        origin = "unknown (the stage record predates recording mkfs UUIDs)"
    log.warning(
        "resumed stage found a filesystem after an interrupted mkfs; keeping it, not formatting",
        extra=fields(device=subject, fs_type=found.fs_type, fs_uuid=found.uuid, origin=origin),
    )


def _refusal(subject: str, fs_type: str, found: Probe, interrupted_uuid: str | None) -> str:
    if found.fs_type:
        text = (
            f"{subject} already holds a {found.fs_type} filesystem, not the requested {fs_type}; "
            f"refusing to format it (its data is left untouched). Request fsType {found.fs_type} to use it"
        )
    else:
        text = f"{subject} already holds {found.other}; refusing to format it (its data is left untouched)"
    if interrupted_uuid is not None:
        text += (
            ". An earlier mkfs of this volume on this node was interrupted, so this may be what it left behind: "
            "if the volume holds nothing you need, delete and re-create it (or erase its signatures with "
            "`wipefs -a` on the mapped device) and stage again"
        )
    return text


def mount_options(fs_type: str, flags: Sequence[str], read_only: bool) -> list[str]:
    options: list[str] = []
    read_only_options = ["ro", *READ_ONLY_MOUNT_OPTIONS.get(fs_type, [])] if read_only else []
    for option in [*COMMON_MOUNT_OPTIONS, *FS_MOUNT_OPTIONS.get(fs_type, []), *flags, *read_only_options]:
        if option not in options:
            options.append(option)
    return options
