"""Read-only accessors for API objects as the informers cache them (plain dicts, camelCase).

Cached dicts are shared by every reader: these helpers never modify them, and code that builds
an update from one copies what it changes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KubeObject = dict[str, Any]


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def name(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("name") or "")


def namespace(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("namespace") or "")


def uid(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid") or "")


def key(obj: Mapping[str, Any]) -> str:
    """"namespace/name" (or "name"), the informer store key."""
    ns = namespace(obj)
    return f"{ns}/{name(obj)}" if ns else name(obj)


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list(meta(obj).get("finalizers") or [])


def has_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    return finalizer in finalizers(obj)


def deleting(obj: Mapping[str, Any]) -> bool:
    """metadata.deletionTimestamp is set: the object is waiting for its finalizers."""
    return bool(meta(obj).get("deletionTimestamp"))
