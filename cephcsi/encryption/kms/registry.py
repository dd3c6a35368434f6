"""KMS types by name (the ConfigMap's `encryptionKMSType`, or ceph-csi's older `KMS_PROVIDER`),
and building one for a call."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cephcsi.encryption.kms.base import Kms, KmsArgs, SecretReader
from cephcsi.errors import InvalidArgument
from cephcsi.observability.logging import fields

log = logging.getLogger(__name__)

Factory = Callable[[KmsArgs], Kms]

TYPE_KEY = "encryptionKMSType"
OLD_TYPE_KEY = "KMS_PROVIDER"

_FACTORIES: dict[str, Factory] = {}

REFUSED: dict[str, str] = {
    "vaulttenantsa": "not implemented yet",
    "aws-metadata": "not implemented yet",
    "aws-sts-metadata": "not implemented yet",
    "azure-kv": "not implemented yet",
    "kmip": "not implemented yet",
}
"""ceph-csi types cephcsi knows of but does not offer (named so the refusal says so)."""


def register(kms_type: str, factory: Factory) -> None:
    if kms_type in _FACTORIES:
        raise ValueError(f"KMS type {kms_type!r} registered twice")
    _FACTORIES[kms_type] = factory


def known_types() -> list[str]:
    _load_builtin()
    return sorted(_FACTORIES)


def type_of(kms_id: str, settings: Mapping[str, Any]) -> str:
    """The type a ConfigMap section names; InvalidArgument when it names none."""
    for key in (TYPE_KEY, OLD_TYPE_KEY):
        value = settings.get(key)
        if value is not None:
            if not isinstance(value, str) or not value:
                raise InvalidArgument(f"KMS {kms_id!r}: {key} must be a non-empty string, not {value!r}")
            return value
    raise InvalidArgument(f"KMS {kms_id!r}: its configuration names no type ({TYPE_KEY})")


def check_type(kms_id: str, kms_type: str) -> None:
    """InvalidArgument naming the type and the known ones when `kms_type` cannot be built."""
    _load_builtin()
    if kms_type in _FACTORIES:
        return
    known = ", ".join(sorted(_FACTORIES))
    why = REFUSED.get(kms_type)
    if why is not None:
        raise InvalidArgument(f"KMS {kms_id!r} has type {kms_type!r}, which cephcsi does not support ({why}); "
                              f"supported types: {known}")
    broken = "".join(f"; {module} failed to import ({error})" for module, error in sorted(_BROKEN.items()))
    raise InvalidArgument(f"KMS {kms_id!r} has unknown type {kms_type!r}; supported types: {known}{broken}")


def build(kms_id: str, settings: Mapping[str, Any], secrets: Mapping[str, str], *, tenant: str = "",
          namespace: str = "", secret_reader: SecretReader | None = None) -> Kms:
    """The KMS of `kms_id` for one call. `settings` is its ConfigMap section; for the default
    KMS (spec.DEFAULT_KMS_ID) it is empty and not consulted."""
    from cephcsi.encryption.spec import DEFAULT_KMS_ID

    kms_type = DEFAULT_KMS_ID if kms_id == DEFAULT_KMS_ID else type_of(kms_id, settings)
    check_type(kms_id, kms_type)
    args = KmsArgs(kms_id=kms_id, settings=settings, secrets=secrets, tenant=tenant, namespace=namespace,
                   secret_reader=secret_reader)
    return _FACTORIES[kms_type](args)


_loaded = False
_LOAD_LOCK = threading.Lock()
_BROKEN: dict[str, str] = {}
"""KMS modules that failed to import (a missing dependency): module → error."""


def _load_builtin() -> None:
    """Import every module of cephcsi.encryption.kms once (each type registers itself there), so
    a caller of the registry never depends on import order. Under a lock, and marked loaded only
    afterwards: a concurrent first call must not see a half-filled registry and refuse a type
    that is still being imported as unknown."""
    global _loaded
    if _loaded:
        return
    with _LOAD_LOCK:
        if not _loaded:
            _import_all()
            _loaded = True


def _import_all() -> None:
    import importlib
    import pkgutil

    from cephcsi.encryption import kms

    for module in pkgutil.iter_modules(kms.__path__):
        if module.name not in ("base", "registry"):
            name = f"cephcsi.encryption.kms.{module.name}"
            try:
                importlib.import_module(name)
            except ImportError as error:
                # The other types still work; a request for this one says why it is missing.
                log.error("KMS module failed to import", extra=fields(module=name, error=str(error)))
                _BROKEN[name] = str(error)
