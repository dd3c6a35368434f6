"""The `vaulttokens` KMS type (ceph-csi's vault_tokens.go): each tenant namespace brings its own Vault
token Secret (and may override connection options); passphrases under `<volume id>`. Design:
docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from cephcsi.encryption.kms.base import Kms, KmsArgs, SecretReader
from cephcsi.encryption.kms.registry import OLD_TYPE_KEY, register
from cephcsi.encryption.kms.vault_common import VaultKv, VaultOptions, apply_options, config_string
from cephcsi.errors import FailedPrecondition, InvalidArgument

log = logging.getLogger(__name__)

KMS_TYPE = "vaulttokens"
DEFAULT_CONFIG_NAME = "ceph-csi-kms-config"
DEFAULT_TOKEN_NAME = "ceph-csi-kms-token"
TOKEN_KEY = "token"
CA_KEY = "cert"

TENANT_OPTIONS = frozenset({
    "vaultAddress", "vaultBackend", "vaultBackendPath", "vaultAuthNamespace", "vaultNamespace",
    "vaultDestroyKeys", "vaultTLSServerName", "vaultCAFromSecret", "vaultCAVerify",
})
"""What a tenant's own ConfigMap may set (ceph-csi's isTenantConfigOption); the rest is ignored."""

_OLD_FORMAT = {
    "KMS_PROVIDER": "encryptionKMSType", "VAULT_ADDR": "vaultAddress", "VAULT_BACKEND": "vaultBackend",
    "VAULT_BACKEND_PATH": "vaultBackendPath", "VAULT_DESTROY_KEYS": "vaultDestroyKeys",
    "VAULT_CACERT": "vaultCAFromSecret", "VAULT_TLS_SERVER_NAME": "vaultTLSServerName",
    "VAULT_CLIENT_CERT": "vaultClientCertFromSecret", "VAULT_CLIENT_KEY": "vaultClientCertKeyFromSecret",
    "VAULT_AUTH_NAMESPACE": "vaultAuthNamespace", "VAULT_NAMESPACE": "vaultNamespace",
}


@runtime_checkable
class ConfigMapReader(Protocol):
    """Reads a ConfigMap's data for the tenant overrides; None when it does not exist. An
    optional second face of the SecretReader the composition root passes."""

    def read_config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        ...


def convert_old_format(config: Mapping[str, Any]) -> dict[str, Any]:
    """ceph-csi's transformConfig: a section written with Vault's environment names (it has
    KMS_PROVIDER) in the ConfigMap's key names. Only the converted keys are kept, as there."""
    converted: dict[str, Any] = {"vaultDestroyKeys": "true", "vaultNamespace": ""}
    for old, new in _OLD_FORMAT.items():
        if old in config:
            converted[new] = config[old]
    skip = config.get("VAULT_SKIP_VERIFY")
    if isinstance(skip, str) and skip.strip().lower() in ("1", "t", "true", "0", "f", "false"):
        converted["vaultCAVerify"] = "false" if skip.strip().lower() in ("1", "t", "true") else "true"
    return converted


class VaultTokensKms(Kms):
    kms_type = KMS_TYPE

    def __init__(self, args: KmsArgs) -> None:
        super().__init__(args.kms_id)
        config: Mapping[str, Any] = args.settings
        if OLD_TYPE_KEY in config:
            config = convert_old_format(config)
        self.tenant = args.tenant
        self._reader = args.secret_reader
        self._driver_namespace = args.namespace
        self.config_name = DEFAULT_CONFIG_NAME
        self.token_name = DEFAULT_TOKEN_NAME
        self.options = self._apply(None, config)
        if self.tenant:
            tenants = config.get("tenants")
            if isinstance(tenants, Mapping) and isinstance(tenants.get(self.tenant), Mapping):
                self.options = self._apply(self.options, tenants[self.tenant])
            own = self._tenant_config_map()
            if own:
                self.options = self._apply(self.options, own)
        for key in ("vaultClientCertFromSecret", "vaultClientCertKeyFromSecret"):
            if config.get(key):
                raise InvalidArgument(f"{self.describe()}: {key} (TLS client certificates) is not supported by "
                                      "cephcsi yet; authenticate with the tenant's token only")
        ca_pem = self._ca_pem() if self.options.ca_from_secret else None
        token = self._token()  # before VaultKv writes its CA file: a missing token leaks none
        self.kv = VaultKv(self.kms_id, KMS_TYPE, self.options, ca_pem=ca_pem)
        self.kv.set_token(token)

    def _apply(self, base: VaultOptions | None, config: Mapping[str, Any]) -> VaultOptions:
        options = apply_options(self.kms_id, base, config)
        self.config_name = config_string(self.kms_id, config, "tenantConfigName") or self.config_name
        self.token_name = config_string(self.kms_id, config, "tenantTokenName") or self.token_name
        return options

    def _secret_reader(self, what: str) -> SecretReader:
        if self._reader is None:
            raise FailedPrecondition(f"{self.describe()}: reading {what} needs the Kubernetes API, "
                                     "which this driver process was started without")
        return self._reader

    def _tenant_config_map(self) -> dict[str, Any]:
        if not self.config_name:
            return {}
        reader = self._secret_reader(f"ConfigMap {self.tenant}/{self.config_name}")
        if not isinstance(reader, ConfigMapReader):
            log.warning("%s: cannot read ConfigMap %s/%s (the Kubernetes reader offers no ConfigMaps); "
                        "tenant overrides there are not applied", self.describe(), self.tenant, self.config_name)
            return {}
        data = reader.read_config_map(self.tenant, self.config_name) or {}
        own = {key: value for key, value in data.items() if key in TENANT_OPTIONS}
        ignored = sorted(set(data) - TENANT_OPTIONS)
        if ignored:
            log.info("%s: ConfigMap %s/%s: options a tenant may not set are ignored: %s",
                     self.describe(), self.tenant, self.config_name, ", ".join(ignored))
        # A tenant that moves to its own Vault namespace logs in there too, unless told otherwise
        # (ceph-csi's setTenantAuthNamespace).
        if "vaultNamespace" in own and "vaultAuthNamespace" not in own and self.options.auth_namespace is None:
            own["vaultAuthNamespace"] = own["vaultNamespace"]
        return own

    def _token(self) -> str:
        if not self.tenant:
            raise InvalidArgument(f"{self.describe()}: the volume has no tenant (claim namespace) to read the "
                                  f"Vault token Secret {self.token_name!r} from; vaulttokens needs the "
                                  "provisioner's csi.storage.k8s.io/pvc/namespace parameter")
        reader = self._secret_reader(f"the Vault token Secret {self.tenant}/{self.token_name}")
        data = reader.read_secret(self.tenant, self.token_name)
        if data is None:
            raise FailedPrecondition(f"{self.describe()}: Secret {self.tenant}/{self.token_name} with the "
                                     "tenant's Vault token does not exist")
        token = data.get(TOKEN_KEY, "").strip()
        if not token:
            raise FailedPrecondition(f"{self.describe()}: Secret {self.tenant}/{self.token_name} has no "
                                     f"{TOKEN_KEY!r} key with the tenant's Vault token")
        return token

    def _ca_pem(self) -> str:
        name = self.options.ca_from_secret
        reader = self._secret_reader(f"the Vault CA Secret {name}")
        for namespace in dict.fromkeys(ns for ns in (self.tenant, self._driver_namespace) if ns):
            data = reader.read_secret(namespace, name)
            if data is not None:
                pem = data.get(CA_KEY)
                if not pem:
                    raise FailedPrecondition(f"{self.describe()}: Secret {namespace}/{name} (vaultCAFromSecret) "
                                             f"has no {CA_KEY!r} key")
                return pem
        raise FailedPrecondition(f"{self.describe()}: the Vault CA Secret {name!r} (vaultCAFromSecret) exists "
                                 f"neither in the tenant's namespace {self.tenant!r} nor in the driver's "
                                 f"{self._driver_namespace!r}")

    @property
    def dek_in_image(self) -> bool:
        return False

    def store(self, volume_id: str, passphrase: str) -> None:
        self.kv.put(volume_id, passphrase)

    def fetch(self, volume_id: str) -> str | None:
        return self.kv.get(volume_id)

    def remove(self, volume_id: str) -> None:
        self.kv.delete(volume_id)

    def close(self) -> None:
        self.kv.close()


register(KMS_TYPE, VaultTokensKms)
