"""Secret references in StorageClass parameters, with external-provisioner's templates (pure); an
invalid reference is an error naming the parameter. Secret values are never logged. Design:
docs/design/sidecars.md.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cephcsi.errors import InvalidArgument
from cephcsi.sidecars import objects
from cephcsi.sidecars.provisioner.names import RESERVED_PREFIX

PROVISIONER = "provisioner"
CONTROLLER_PUBLISH = "controller-publish"
NODE_STAGE = "node-stage"
NODE_PUBLISH = "node-publish"
CONTROLLER_EXPAND = "controller-expand"
NODE_EXPAND = "node-expand"
CONTROLLER_MODIFY = "controller-modify"
KINDS = (PROVISIONER, CONTROLLER_PUBLISH, NODE_STAGE, NODE_PUBLISH, CONTROLLER_EXPAND, NODE_EXPAND, CONTROLLER_MODIFY)

_TOKEN = re.compile(r"\$\{([^}]*)\}|\$([A-Za-z0-9_]+)")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class SecretRef:
    name: str
    namespace: str

    def to_api(self) -> dict[str, str]:
        """As a PV's spec.csi.*SecretRef."""
        return {"name": self.name, "namespace": self.namespace}


def name_key(kind: str) -> str:
    return f"{RESERVED_PREFIX}{kind}-secret-name"


def namespace_key(kind: str) -> str:
    return f"{RESERVED_PREFIX}{kind}-secret-namespace"


def secret_keys() -> tuple[str, ...]:
    """Every secret-reference parameter key."""
    return tuple(k for kind in KINDS for k in (name_key(kind), namespace_key(kind)))


def resolve_template(template: str, values: Mapping[str, str]) -> str:
    """Replace ${token} (and $token) by values[token]; an unknown token is an error that lists
    every unknown token (external-provisioner's `invalid tokens: [...]`)."""
    missing: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        token = match.group(1) if match.group(1) is not None else match.group(2)
        if token not in values:
            missing.append(token)
            return ""
        return values[token]

    resolved = _TOKEN.sub(substitute, template)
    if missing:
        raise InvalidArgument(f"invalid tokens: {sorted(set(missing))}")
    return resolved


def template_values(pv_name: str, claim: Mapping[str, Any] | None, *, for_name: bool) -> dict[str, str]:
    values = {"pv.name": pv_name}
    if claim is not None:
        values["pvc.namespace"] = objects.namespace(claim)
        if for_name:
            values["pvc.name"] = objects.name(claim)
            for key, value in objects.annotations_of(claim).items():
                values[f"pvc.annotations['{key}']"] = value
    return values


def secret_ref(kind: str, parameters: Mapping[str, str], pv_name: str,
               claim: Mapping[str, Any] | None) -> SecretRef | None:
    """The Secret the class names for `kind`, resolved for this claim; None when not set."""
    name_template = parameters.get(name_key(kind), "")
    namespace_template = parameters.get(namespace_key(kind), "")
    if not name_template and not namespace_template:
        return None
    if not name_template or not namespace_template:
        raise InvalidArgument(
            f"StorageClass parameters {name_key(kind)} and {namespace_key(kind)} must be given together"
        )
    namespace = _resolve(namespace_key(kind), namespace_template, template_values(pv_name, claim, for_name=False),
                         _DNS_LABEL, 63, "namespace name")
    name = _resolve(name_key(kind), name_template, template_values(pv_name, claim, for_name=True),
                    _DNS_SUBDOMAIN, 253, "Secret name")
    return SecretRef(name, namespace)


def _resolve(key: str, template: str, values: Mapping[str, str], pattern: re.Pattern[str], max_length: int,
             what: str) -> str:
    """One StorageClass secret parameter, templates filled in and the result checked."""
    try:
        value = resolve_template(template, values)
    except InvalidArgument as error:
        raise InvalidArgument(f"{key}={template!r}: {error}") from None
    if not pattern.match(value) or len(value) > max_length:
        raise InvalidArgument(f"{key}={template!r} resolved to {value!r}, which is not a valid {what}")
    return value
