"""The `vault` KMS type (ceph-csi's vault.go): one Vault for every volume, kubernetes auth login (or
VAULT_TOKEN), passphrases in a KV mount under `<vaultPassphrasePath>/<volume id>`. Design:
docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cephcsi.encryption.kms.base import Kms, KmsArgs
from cephcsi.encryption.kms.registry import register
from cephcsi.encryption.kms.vault_common import VaultKv, apply_options, config_string
from cephcsi.errors import FailedPrecondition, InvalidArgument

KMS_TYPE = "vault"
DEFAULT_AUTH_PATH = "/v1/auth/kubernetes/login"
DEFAULT_ROLE = "csi-kubernetes"
SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
TOKEN_ENV = "VAULT_TOKEN"


def auth_mount_path(kms_id: str, auth_path: str) -> str:
    """ceph-csi's detectAuthMountPath: the components between "auth" and "login" of
    vaultAuthPath ("/v1/auth/kubernetes/login" -> "kubernetes"); a path without them is
    taken as the mount itself."""
    if not auth_path:
        raise InvalidArgument(f"KMS {kms_id!r}: vaultAuthPath is empty")
    mount: list[str] = []
    inside = False
    for part in auth_path.split("/"):
        if part == "auth":
            inside = True
            continue
        if part == "login":
            break
        if inside:
            mount.append(part)
    return "/".join(mount) if mount else auth_path


class VaultKms(Kms):
    kms_type = KMS_TYPE

    def __init__(self, kms_id: str, settings: Mapping[str, Any], secrets: Mapping[str, str], *,
                 token_path: str = SERVICE_ACCOUNT_TOKEN_PATH, environ: Mapping[str, str] | None = None) -> None:
        super().__init__(kms_id)
        config = dict(settings)
        root = config_string(kms_id, config, "vaultPassphraseRoot")
        if root is not None:
            # the old examples wrote "/v1/secret/"
            config["vaultBackendPath"] = root.removeprefix("/v1/")
        self.options = apply_options(kms_id, None, config)
        self.passphrase_path = config_string(kms_id, config, "vaultPassphrasePath") or ""
        role = config_string(kms_id, config, "vaultRole")
        self.role = DEFAULT_ROLE if role is None else role
        self.auth_mount = auth_mount_path(kms_id, config_string(kms_id, config, "vaultAuthPath") or DEFAULT_AUTH_PATH)
        ca_pem = None
        if self.options.ca_from_secret:
            ca_pem = secrets.get(self.options.ca_from_secret)
            if ca_pem is None:
                raise InvalidArgument(f"KMS {kms_id!r}: vaultCAFromSecret names {self.options.ca_from_secret!r}, "
                                      "which the call's secrets do not contain")
        self.kv = VaultKv(kms_id, KMS_TYPE, self.options, ca_pem=ca_pem)
        self._token_path = token_path
        self._environ = os.environ if environ is None else environ
        self._authenticated = False

    @property
    def dek_in_image(self) -> bool:
        return False

    def _connect(self) -> VaultKv:
        if not self._authenticated:
            token = self._environ.get(TOKEN_ENV, "").strip()
            if token:
                self.kv.set_token(token)
            else:
                self.kv.login_kubernetes(self.role, self.auth_mount, self._service_account_token())
            self._authenticated = True
        return self.kv

    def _service_account_token(self) -> str:
        try:
            with open(self._token_path, encoding="utf-8") as handle:
                return handle.read()
        except OSError as error:
            raise FailedPrecondition(
                f"{self.describe()}: cannot read the ServiceAccount token {self._token_path} to log in to Vault "
                f"with kubernetes auth ({error.strerror}); run the driver with a ServiceAccount token mounted, "
                f"or set {TOKEN_ENV}") from None

    def secret_id(self, volume_id: str) -> str:
        return f"{self.passphrase_path.rstrip('/')}/{volume_id}" if self.passphrase_path.strip("/") else volume_id

    def store(self, volume_id: str, passphrase: str) -> None:
        self._connect().put(self.secret_id(volume_id), passphrase)

    def fetch(self, volume_id: str) -> str | None:
        return self._connect().get(self.secret_id(volume_id))

    def remove(self, volume_id: str) -> None:
        self._connect().delete(self.secret_id(volume_id))

    def close(self) -> None:
        self.kv.close()


def _build(args: KmsArgs) -> Kms:
    return VaultKms(args.kms_id, args.settings, args.secrets)


register(KMS_TYPE, _build)
