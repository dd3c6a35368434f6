"""`cephcsi rotate-key`: rotate the LUKS passphrase of an encrypted volume where it is staged (run
in the node plugin container, the node-stage Secret on stdin only). Exit status: 0 rotated, 1 the
rotation failed, 2 usage error. Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import argparse
import base64
import binascii
import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

from cephcsi.ceph.credentials import Credentials
from cephcsi.cli.args import _Parser, _positive
from cephcsi.cli.kms_secrets import LazyKubeReader
from cephcsi.config.clusters import ClusterRegistry
from cephcsi.encryption import kms_config
from cephcsi.encryption.spec import BLOCK, DEFAULT_KMS_ID, EncryptionSpec
from cephcsi.encryption.volume_keys import VolumeKeys, new_passphrase
from cephcsi.errors import CephCSIError, InvalidArgument
from cephcsi.node import exec as node_exec
from cephcsi.node.image_meta import RbdImageMetadata
from cephcsi.node.journal_owner import JournalOwner
from cephcsi.node.key_rotation import (
    CryptsetupSlots,
    KmsKeyStore,
    RotationLock,
    find_stage,
    node_lock,
    refuse_default,
    rotate,
)
from cephcsi.observability import logging as cephcsi_logging
from cephcsi.settings import Settings

USAGE_ERROR = 2
FAILED = 1


class _RotateParser(_Parser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"cephcsi rotate-key: error: {message} (see cephcsi rotate-key --help)\n")


def build_parser() -> argparse.ArgumentParser:
    defaults = Settings(mode="node")
    p = _RotateParser(prog="cephcsi rotate-key", description=(
        "Rotate the LUKS2 passphrase of an encrypted Block-mode (encryptionType: block) volume staged on "
        "this node: a new passphrase in the header and in the KMS, the old one removed from both. Reads the "
        "volume's node-stage Secret (JSON) from stdin. Safe to rerun after an interruption."))
    p.add_argument("--volume-id", required=True, help="the volume's id (the PersistentVolume's volumeHandle)")
    p.add_argument("--kms-id", required=True,
                   help="the StorageClass's encryptionKMSID (a section of the KMS ConfigMap); the default KMS "
                        "(no encryptionKMSID) cannot rotate")
    p.add_argument("--staging-path", default="",
                   help="the volume's staging path (default: found under --kubelet-dir by its stage record)")
    p.add_argument("--kubelet-dir", default=defaults.node.kubelet_dir)
    p.add_argument("--config-file", default=defaults.config_file, help="ceph-csi's config.json (the monitors)")
    p.add_argument("--kms-config", default=kms_config.DEFAULT_PATH, help="the KMS ConfigMap's config.json")
    p.add_argument("--runtime-dir", default=defaults.node.runtime_dir, help="where this node's lock file lives")
    p.add_argument("--command-timeout", type=_positive(float), default=defaults.node.command_timeout,
                   help="seconds per cryptsetup/rbd run")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_secret(text: str) -> dict[str, str]:
    """A Kubernetes Secret as JSON (data base64, stringData plain) or a flat JSON object of strings."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise InvalidArgument("stdin holds no JSON: pipe the Secret in (`kubectl get secret <name> -o json`)") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("stdin holds no JSON object: pipe the Secret in (`kubectl get secret <name> -o json`)")
    if doc.get("kind") == "Secret" or "data" in doc or "stringData" in doc:
        values: dict[str, str] = {}
        data = doc.get("data") or {}
        if not isinstance(data, Mapping):
            raise InvalidArgument("the Secret's data is not an object")
        for key, value in data.items():
            try:
                values[str(key)] = base64.b64decode(str(value), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise InvalidArgument(f"the Secret's data.{key} is not base64 of UTF-8 text") from None
        string_data = doc.get("stringData") or {}
        if isinstance(string_data, Mapping):
            values.update({str(key): str(value) for key, value in string_data.items()})
        return values
    if not all(isinstance(value, str) for value in doc.values()):
        raise InvalidArgument("the JSON object on stdin must map the Secret's keys to strings")
    return {str(key): str(value) for key, value in doc.items()}


def run(a: argparse.Namespace, secrets: Mapping[str, str]) -> str:
    spec = EncryptionSpec(BLOCK, a.kms_id or DEFAULT_KMS_ID)
    refuse_default(spec)
    record = find_stage(a.kubelet_dir, a.volume_id, a.staging_path)
    credentials = Credentials.from_secrets(secrets)
    cluster = ClusterRegistry(a.config_file).get(record.cluster_id)
    metadata = RbdImageMetadata(node_exec.run, a.command_timeout, record.image_spec, cluster.mon_host, credentials)
    # The KMS as NodeStage builds it: Secrets and ConfigMaps through the API (in-cluster, on the
    # first read a KMS asks for) and the tenant from the volume's journal record.
    keys = VolumeKeys(a.kms_config, secret_reader=LazyKubeReader(),
                      namespace=os.environ.get("POD_NAMESPACE", ""))
    kms = keys.kms(spec, secrets, JournalOwner.beside(metadata).read(a.volume_id))
    cluster_lock = RotationLock(node_exec.run, a.command_timeout, record.image_spec, cluster.mon_host, credentials,
                               a.volume_id, socket.gethostname())
    try:
        with node_lock(a.runtime_dir, a.volume_id), cluster_lock.held() as still_locked:
            rotate(CryptsetupSlots(node_exec.run, a.command_timeout, record.device, a.volume_id),
                   KmsKeyStore(kms, metadata, a.volume_id), new_passphrase, a.volume_id, still_locked=still_locked)
        return kms.describe()
    finally:
        kms.close()


def main(argv: Sequence[str]) -> int:
    a = build_parser().parse_args(argv)
    cephcsi_logging.configure(a.log_level)
    try:
        secrets = parse_secret(sys.stdin.read())
        where = run(a, secrets)
    except CephCSIError as error:
        sys.stderr.write(f"cephcsi rotate-key: error: {error}\n")
        return FAILED
    sys.stdout.write(f"volume {a.volume_id}: LUKS key rotated; the new passphrase is kept by {where}\n")
    return 0
