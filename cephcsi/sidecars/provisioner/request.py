"""From a claim and its StorageClass to the CreateVolume request, as external-provisioner builds it
(pure; name `pvc-<claim uid>`, so every retry asks for the same volume). Design: docs/design/sidecars.md.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from cephcsi._generated import csi_pb2
from cephcsi.errors import InvalidArgument
from cephcsi.sidecars import objects
from cephcsi.sidecars.provisioner import names, secrets

Mode = csi_pb2.VolumeCapability.AccessMode

KNOWN_RESERVED_KEYS = frozenset({names.FSTYPE_KEY, *secrets.secret_keys()})
_BINARY_SUFFIXES = (("Ei", 1 << 60), ("Pi", 1 << 50), ("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10))


@dataclass(frozen=True)
class RequestOptions:
    driver_name: str
    default_fstype: str = "ext4"
    extra_create_metadata: bool = False
    single_node_multi_writer: bool = False
    """The controller advertises SINGLE_NODE_MULTI_WRITER (changes the RWO/RWOP mapping)."""


@dataclass(frozen=True)
class PlannedVolume:
    """Everything CreateVolume needs except secrets and topology."""

    name: str
    required_bytes: int
    limit_bytes: int
    access_modes: tuple[str, ...]
    block: bool
    fs_type: str
    """"" for block volumes."""
    mount_options: tuple[str, ...]
    parameters: dict[str, str] = field(default_factory=dict)
    """For CreateVolume (reserved keys stripped)."""
    class_parameters: dict[str, str] = field(default_factory=dict)
    """The class's parameters as written (secret references are resolved from these)."""

    def capabilities(self, single_node_multi_writer: bool) -> list[csi_pb2.VolumeCapability]:
        return [self.capability(mode, single_node_multi_writer) for mode in self.access_modes]

    def capability(self, access_mode: str, single_node_multi_writer: bool) -> csi_pb2.VolumeCapability:
        mode = Mode(mode=csi_access_mode(access_mode, single_node_multi_writer))
        if self.block:
            return csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=mode)
        mount = csi_pb2.VolumeCapability.MountVolume(fs_type=self.fs_type, mount_flags=list(self.mount_options))
        return csi_pb2.VolumeCapability(mount=mount, access_mode=mode)

    def to_proto(self, options: RequestOptions, secret_values: Mapping[str, str],
                 accessibility: csi_pb2.TopologyRequirement | None = None) -> csi_pb2.CreateVolumeRequest:
        request = csi_pb2.CreateVolumeRequest(
            name=self.name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=self.required_bytes, limit_bytes=self.limit_bytes),
            volume_capabilities=self.capabilities(options.single_node_multi_writer),
            parameters=self.parameters,
            secrets=dict(secret_values),
        )
        if accessibility is not None:
            request.accessibility_requirements.CopyFrom(accessibility)
        return request


def csi_access_mode(access_mode: str, single_node_multi_writer: bool) -> csi_pb2.VolumeCapability.AccessMode.Mode:
    if access_mode == "ReadWriteOnce":
        return Mode.SINGLE_NODE_MULTI_WRITER if single_node_multi_writer else Mode.SINGLE_NODE_WRITER
    if access_mode == "ReadWriteOncePod":
        return Mode.SINGLE_NODE_SINGLE_WRITER if single_node_multi_writer else Mode.SINGLE_NODE_WRITER
    if access_mode == "ReadOnlyMany":
        return Mode.MULTI_NODE_READER_ONLY
    if access_mode == "ReadWriteMany":
        return Mode.MULTI_NODE_MULTI_WRITER
    raise InvalidArgument(f"unknown access mode {access_mode!r} in the claim")


def quantity_bytes(text: object, what: str) -> int:
    """A resource quantity ("10Gi", "500M", "1.5Gi") as whole bytes, rounded up like
    resource.Quantity.Value()."""
    try:
        # parse_quantity takes numbers as they are and anything else by its str(), as here.
        value = parse_quantity(text if isinstance(text, (int, float, Decimal)) else str(text))
    except (ValueError, TypeError, InvalidOperation):
        raise InvalidArgument(f"{what} {text!r} is not a valid quantity") from None
    if value < 0:
        raise InvalidArgument(f"{what} {text!r} must not be negative")
    return int(math.ceil(value))


def format_bytes(size: int) -> str:
    """Bytes as the canonical binary quantity Kubernetes prints ("1Gi", "8Mi", "1536Mi")."""
    for suffix, unit in _BINARY_SUFFIXES:
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def strip_reserved(parameters: Mapping[str, str]) -> dict[str, str]:
    """The class parameters for CreateVolume: reserved keys removed, unknown reserved keys refused."""
    unknown = sorted(k for k in parameters if k.startswith(names.RESERVED_PREFIX) and k not in KNOWN_RESERVED_KEYS)
    if unknown:
        raise InvalidArgument(f"found unknown parameter key(s) {', '.join(unknown)} with reserved namespace {names.RESERVED_PREFIX}")
    return {k: v for k, v in parameters.items() if not k.startswith(names.RESERVED_PREFIX)}


def plan(claim: Mapping[str, Any], storage_class: Mapping[str, Any], options: RequestOptions) -> PlannedVolume:
    """The volume to create for `claim`; InvalidArgument names what is wrong with claim or class."""
    volume_name = names.volume_name(objects.uid(claim))
    spec = objects.spec(claim)
    resources = spec.get("resources") or {}
    request = (resources.get("requests") or {}).get("storage")
    if request is None:
        raise InvalidArgument("claim has no spec.resources.requests.storage")
    required = quantity_bytes(request, "spec.resources.requests.storage")
    limit_text = (resources.get("limits") or {}).get("storage")
    limit = quantity_bytes(limit_text, "spec.resources.limits.storage") if limit_text is not None else 0
    access_modes: Sequence[str] = spec.get("accessModes") or ()
    if not access_modes:
        raise InvalidArgument("claim has no spec.accessModes")
    class_parameters = {str(k): str(v) for k, v in (storage_class.get("parameters") or {}).items()}
    parameters = strip_reserved(class_parameters)
    if options.extra_create_metadata:
        parameters[names.PVC_NAME_KEY] = objects.name(claim)
        parameters[names.PVC_NAMESPACE_KEY] = objects.namespace(claim)
        parameters[names.PV_NAME_KEY] = volume_name
    block = spec.get("volumeMode") == "Block"
    fs_type = "" if block else (class_parameters.get(names.FSTYPE_KEY) or options.default_fstype)
    planned = PlannedVolume(
        name=volume_name,
        required_bytes=required,
        limit_bytes=limit,
        access_modes=tuple(access_modes),
        block=block,
        fs_type=fs_type,
        mount_options=tuple(storage_class.get("mountOptions") or ()),
        parameters=parameters,
        class_parameters=class_parameters,
    )
    for mode in planned.access_modes:
        csi_access_mode(mode, options.single_node_multi_writer)  # refuse unknown modes early
    return planned
