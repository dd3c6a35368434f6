"""The KMS configuration: ceph-csi's `ceph-csi-encryption-kms-config` ConfigMap (`config.json`,
`{"<kmsID>": {"encryptionKMSType": …}}`) mounted as a file, read on every use.
Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cephcsi.errors import ConfigError, InvalidArgument

DEFAULT_PATH = "/etc/ceph-csi-encryption-kms-config/config.json"


def load(path: str | Path) -> dict[str, Mapping[str, Any]]:
    """Every KMS section by id; a missing file means none. A file that is not a JSON object
    of objects is a ConfigError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise ConfigError(f"cannot read the KMS configuration {path}: {error.strerror}") from None
    try:
        doc = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as error:
        raise ConfigError(f"the KMS configuration {path} is not valid JSON: {error}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"the KMS configuration {path} must be a JSON object keyed by KMS id")
    sections: dict[str, Mapping[str, Any]] = {}
    for kms_id, section in doc.items():
        if not isinstance(section, dict):
            raise ConfigError(f"the KMS configuration {path}: section {kms_id!r} must be a JSON object")
        sections[kms_id] = section
    return sections


def section(path: str | Path, kms_id: str) -> Mapping[str, Any]:
    """The settings of `kms_id`; InvalidArgument naming it (and the ids there are) when absent."""
    sections = load(path)
    found = sections.get(kms_id)
    if found is None:
        have = ", ".join(sorted(sections)) or "none"
        raise InvalidArgument(
            f"encryptionKMSID {kms_id!r} is not configured in the KMS configuration {path} (configured: {have})"
        )
    return found
