"""RBD QoS as StorageClass and VolumeAttributesClass parameters: parsed and validated in full
before anything is touched, scaled with the volume's size, and turned into the image metadata
that holds it.

ceph-csi's parameter and metadata keys (limits as `conf_rbd_qos_…`, the policy beside them),
stricter validation. librbd enforces them for rbd-nbd and fuse; for krbd the node writes them
as the pod's cgroup io.max at publish (cephcsi.node.io_max). Formula and rules: docs/design/controller.md.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cephcsi.errors import InvalidArgument

GiB = 1 << 30
MAX_VALUE = (1 << 63) - 1
CONFIG_PREFIX = "conf_"
KUBERNETES_PREFIX = "csi.storage.k8s.io/"


@dataclass(frozen=True)
class Kind:
    """One librbd limit and the parameters that set it."""

    name: str
    """librbd's option, e.g. rbd_qos_read_iops_limit."""
    base: str
    maximum: str
    per_gib: str
    stored_base: str
    stored_max: str
    stored_per_gib: str

    @property
    def config_key(self) -> str:
        return CONFIG_PREFIX + self.name


def _kind(short: str, camel: str, lower: str) -> Kind:
    return Kind(name=f"rbd_qos_{short}_limit", base=f"base{camel}", maximum=f"max{camel}", per_gib=f"{lower}PerGiB",
                stored_base=f"rbd_base_qos_{short}_limit", stored_max=f"rbd_max_qos_{short}_limit",
                stored_per_gib=f"rbd_{short}_per_gib_limit")


KINDS = (
    _kind("iops", "Iops", "iops"),
    _kind("read_iops", "ReadIops", "readIops"),
    _kind("write_iops", "WriteIops", "writeIops"),
    _kind("bps", "Bps", "bps"),
    _kind("read_bps", "ReadBps", "readBps"),
    _kind("write_bps", "WriteBps", "writeBps"),
)
BASE_SIZE = "baseVolSizeBytes"
STORED_BASE_SIZE = "rbd_base_qos_vol_size"
ALIASES = {
    "BaseReadIops": "baseReadIops",
    "BaseWriteIops": "baseWriteIops",
    "BaseReadBytesPerSecond": "baseReadBps",
    "BaseWriteBytesPerSecond": "baseWriteBps",
    "ReadIopsPerGiB": "readIopsPerGiB",
    "WriteIopsPerGiB": "writeIopsPerGiB",
    "ReadBpsPerGiB": "readBpsPerGiB",
    "WriteBpsPerGiB": "writeBpsPerGiB",
    "BaseVolSizeBytes": BASE_SIZE,
}
"""The spellings of ceph-csi's first rbd-nbd QoS StorageClass parameters."""
CANONICAL_KEYS = tuple(key for kind in KINDS for key in (kind.base, kind.maximum, kind.per_gib)) + (BASE_SIZE,)
KEYS = CANONICAL_KEYS + tuple(ALIASES)
"""Every parameter key this module reads (StorageClass and VolumeAttributesClass alike)."""
MANAGED_METADATA = tuple(
    key for kind in KINDS for key in (kind.config_key, kind.stored_base, kind.stored_max, kind.stored_per_gib)
) + (STORED_BASE_SIZE,)
"""Every image-meta key a policy may write; keys of these a new policy does not name are removed."""


@dataclass(frozen=True)
class Limit:
    base: int
    maximum: int | None = None
    per_gib: int | None = None


@dataclass(frozen=True)
class Policy:
    limits: tuple[tuple[Kind, Limit], ...] = ()
    base_size: int | None = None

    @property
    def empty(self) -> bool:
        return not self.limits

    def limit_values(self, size: int) -> dict[str, int]:
        """librbd option → limit for a volume of `size` bytes."""
        return {kind.name: scaled(limit, self.base_size, size) for kind, limit in self.limits}

    def metadata(self, size: int) -> dict[str, str]:
        """The image-meta keys (limits and the policy they came from) for `size` bytes."""
        wanted: dict[str, str] = {}
        for kind, limit in self.limits:
            wanted[kind.config_key] = str(scaled(limit, self.base_size, size))
            wanted[kind.stored_base] = str(limit.base)
            if limit.maximum is not None:
                wanted[kind.stored_max] = str(limit.maximum)
            if limit.per_gib is not None:
                wanted[kind.stored_per_gib] = str(limit.per_gib)
        if self.base_size is not None and not self.empty:
            wanted[STORED_BASE_SIZE] = str(self.base_size)
        return wanted


def scaled(limit: Limit, base_size: int | None, size: int) -> int:
    if limit.per_gib is None or base_size is None or size <= base_size:
        return limit.base
    value = limit.base + (size - base_size) // GiB * limit.per_gib
    if limit.maximum is not None:
        value = min(value, limit.maximum)
    return min(value, MAX_VALUE)


def qos_keys(parameters: Mapping[str, str]) -> dict[str, str]:
    """The QoS keys among `parameters` (a StorageClass's), others left out."""
    return {key: value for key, value in parameters.items() if key in KEYS}


def parse(parameters: Mapping[str, str], field: str = "mutable_parameters", allow_other: bool = False) -> Policy:
    """The policy `parameters` describe; InvalidArgument naming every bad key at once. With
    `allow_other`, keys that are not QoS keys are left to the caller (StorageClass parameters)."""
    problems: list[str] = []
    canonical: dict[str, str] = {}
    # external-resizer's --extra-modify-metadata adds the claim's and PV's names under this prefix.
    unknown = sorted(key for key in parameters if key not in KEYS and not key.startswith(KUBERNETES_PREFIX))
    if unknown and not allow_other:
        problems.append(f"unknown key(s) {', '.join(unknown)} (supported: {', '.join(CANONICAL_KEYS)})")
    for key, value in parameters.items():
        if key not in KEYS:
            continue
        name = ALIASES.get(key, key)
        if name in canonical and canonical[name] != value:
            problems.append(f"{key} and {name} are the same setting with different values")
        canonical[name] = value
    numbers: dict[str, int] = {}
    for name, value in sorted(canonical.items()):
        number = _whole(value)
        if number is None:
            problems.append(f"{name}={value!r} is not a whole number between 0 and {MAX_VALUE}")
        else:
            numbers[name] = number
    limits: list[tuple[Kind, Limit]] = []
    for kind in KINDS:
        base, maximum, per_gib = (numbers.get(k) for k in (kind.base, kind.maximum, kind.per_gib))
        for dependent in (kind.maximum, kind.per_gib):
            if dependent in canonical and kind.base not in canonical:
                problems.append(f"{dependent} needs {kind.base} (the limit it adjusts)")
        if kind.per_gib in canonical and BASE_SIZE not in canonical:
            problems.append(f"{kind.per_gib} needs {BASE_SIZE} (the size above which it adds to {kind.base})")
        if base is not None and maximum is not None and maximum < base:
            problems.append(f"{kind.maximum}={maximum} is below {kind.base}={base}")
        if base is not None:
            limits.append((kind, Limit(base, maximum, per_gib)))
    if BASE_SIZE in canonical and not any(kind.per_gib in canonical for kind in KINDS):
        problems.append(f"{BASE_SIZE} is set but no *PerGiB limit uses it")
    if problems:
        raise InvalidArgument(f"{field}: " + "; ".join(problems) + "; nothing was changed")
    return Policy(tuple(limits), numbers.get(BASE_SIZE))


def stored(metadata: Mapping[str, str]) -> Policy:
    """The policy kept in an image's metadata (ours or ceph-csi's); an unreadable value drops
    its limit's scaling rather than failing an expansion."""
    limits: list[tuple[Kind, Limit]] = []
    for kind in KINDS:
        base = _whole(metadata.get(kind.stored_base, ""))
        if base is None:
            continue
        limits.append((kind, Limit(base, _whole(metadata.get(kind.stored_max, "")),
                                   _whole(metadata.get(kind.stored_per_gib, "")))))
    return Policy(tuple(limits), _whole(metadata.get(STORED_BASE_SIZE, "")))


def changes(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """Managed keys to write (value) or remove (None) to go from `current` to `wanted`."""
    diff: dict[str, str | None] = {key: value for key, value in wanted.items() if current.get(key) != value}
    diff.update({key: None for key in MANAGED_METADATA if key in current and key not in wanted})
    return diff


def _whole(text: str) -> int | None:
    if not text.isascii() or not text.isdigit():
        return None
    number = int(text)
    return number if number <= MAX_VALUE else None
