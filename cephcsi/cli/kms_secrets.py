"""The Kubernetes Secrets a KMS reads (cephcsi.encryption.kms.base.SecretReader), through the
sidecars' API client: the `metadata` type's secretName, per-tenant tokens. Built where the API
client is (cli/sidecar_wiring.py); a controller without Kubernetes access has none, and a KMS
that needs one says so."""
from __future__ import annotations

from collections.abc import Mapping

from cephcsi.errors import NotFound
from cephcsi.sidecars.api import KubeApi


class KubeSecretReader:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            return self.api.read_secret(namespace, name)
        except NotFound:
            return None
