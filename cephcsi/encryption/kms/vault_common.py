"""What the `vault` and `vaulttokens` KMS types share: their connection settings and the KV store
they keep passphrases in, in ceph-csi's layout (via hvac). Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import os
import posixpath
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import hvac
import hvac.exceptions
import requests
import requests.adapters

from cephcsi.encryption.kms.base import KmsUnavailable
from cephcsi.errors import CephCSIError, Internal, InvalidArgument, PermissionDenied

DEFAULT_BACKEND_PATH = "secret/"
KV_V1 = "kv"
KV_V2 = "kv-v2"
PASSPHRASE_FIELD = "passphrase"
TIMEOUT_SECONDS = 10
"""Per request; a CSI call has a deadline of its own and a hung Vault must not eat all of it."""


@dataclass(frozen=True)
class VaultOptions:
    """Connection settings from the ConfigMap section (and, for vaulttokens, a tenant's
    overrides). Defaults are ceph-csi's."""

    address: str = ""
    backend: str = ""
    """"kv", "kv-v2", or "" to ask Vault (sys/mounts) which version the mount is."""
    backend_path: str = DEFAULT_BACKEND_PATH
    destroy_keys: bool = True
    tls_server_name: str = ""
    namespace: str = ""
    """Vault Enterprise namespace: prefixes every secret path."""
    auth_namespace: str | None = None
    """Namespace header for login and mount lookup; None: the same as `namespace`."""
    ca_verify: bool = True
    ca_from_secret: str = ""

    @property
    def effective_auth_namespace(self) -> str:
        return self.namespace if self.auth_namespace is None else self.auth_namespace


def config_string(kms_id: str, config: Mapping[str, Any], key: str) -> str | None:
    """ceph-csi's setConfigString: None when absent, InvalidArgument when not a string."""
    if key not in config:
        return None
    value = config[key]
    if not isinstance(value, str):
        raise InvalidArgument(f"KMS {kms_id!r}: option {key!r} must be a string, not {value!r}")
    return value


def _parse_bool(kms_id: str, key: str, value: object) -> bool:
    # ceph-csi's own example writes vaultCAVerify as a JSON boolean; accept both spellings.
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "t", "true"):
            return True
        if text in ("0", "f", "false"):
            return False
    raise InvalidArgument(f"KMS {kms_id!r}: option {key!r} must be true or false, not {value!r}")


def apply_options(kms_id: str, base: VaultOptions | None, config: Mapping[str, Any]) -> VaultOptions:
    """`base` updated with the options present in `config` (base None: the first, global
    section, where vaultAddress is required). Later calls apply tenant overrides."""
    opts = base if base is not None else VaultOptions()
    changes: dict[str, Any] = {}
    address = config_string(kms_id, config, "vaultAddress")
    if address is not None:
        if not address.startswith(("http://", "https://")):
            raise InvalidArgument(f"KMS {kms_id!r}: vaultAddress {address!r} must start with http:// or https://")
        changes["address"] = address.rstrip("/")
    elif base is None:
        raise InvalidArgument(f"KMS {kms_id!r}: option 'vaultAddress' is required")
    backend = config_string(kms_id, config, "vaultBackend")
    if backend is not None:
        if backend not in ("", KV_V1, KV_V2):
            raise InvalidArgument(f"KMS {kms_id!r}: vaultBackend {backend!r} must be {KV_V1!r} or {KV_V2!r}")
        changes["backend"] = backend
    backend_path = config_string(kms_id, config, "vaultBackendPath")
    if backend_path is not None:
        changes["backend_path"] = backend_path or DEFAULT_BACKEND_PATH
    destroy = config_string(kms_id, config, "vaultDestroyKeys")
    if destroy is not None:
        # ceph-csi destroys only for exactly "true"; any other text keeps the old versions.
        changes["destroy_keys"] = destroy == "true"
    for key, name in (("vaultTLSServerName", "tls_server_name"), ("vaultNamespace", "namespace"),
                      ("vaultCAFromSecret", "ca_from_secret")):
        value = config_string(kms_id, config, key)
        if value is not None:
            changes[name] = value
    auth_namespace = config_string(kms_id, config, "vaultAuthNamespace")
    if auth_namespace is not None:
        changes["auth_namespace"] = auth_namespace or None
    if "vaultCAVerify" in config:
        changes["ca_verify"] = _parse_bool(kms_id, "vaultCAVerify", config["vaultCAVerify"])
    return replace(opts, **changes)


class _ServerNameAdapter(requests.adapters.HTTPAdapter):
    """Sends `server_name` as the TLS SNI and checks the certificate against it instead of the
    address's host (ceph-csi's vaultTLSServerName)."""

    def __init__(self, server_name: str) -> None:
        self._server_name = server_name
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["server_hostname"] = self._server_name
        kwargs["assert_hostname"] = self._server_name
        super().init_poolmanager(*args, **kwargs)


class VaultKv:
    """A connection to one Vault KV mount for one KMS, authenticated by a token (given, or got
    from a login). Never puts the token into a message or a log line."""

    def __init__(self, kms_id: str, kms_type: str, opts: VaultOptions, *, ca_pem: str | None = None) -> None:
        self.kms_id = kms_id
        self.kms_type = kms_type
        self.opts = opts
        self._ca_file: str | None = None
        verify: bool | str = opts.ca_verify
        if ca_pem is not None and opts.ca_verify:
            # requests verifies against a file only; removed again by close().
            fd, self._ca_file = tempfile.mkstemp(prefix="cephcsi-vault-ca-", suffix=".pem")
            with os.fdopen(fd, "w") as handle:
                handle.write(ca_pem)
            verify = self._ca_file
        session = requests.Session()
        # hvac takes a given session's own `verify` over its argument, and a new session's is True.
        session.verify = verify
        if opts.tls_server_name:
            session.mount("https://", _ServerNameAdapter(opts.tls_server_name))
        self._client = hvac.Client(url=opts.address, verify=verify, timeout=TIMEOUT_SECONDS, session=session)
        self._kv_v2: bool | None = {KV_V1: False, KV_V2: True}.get(opts.backend)

    def describe(self) -> str:
        return f"KMS {self.kms_id!r} (type {self.kms_type}, Vault at {self.opts.address})"

    def set_token(self, token: str) -> None:
        self._client.token = token.strip()

    def login_kubernetes(self, role: str, mount: str, jwt: str) -> None:
        """Vault's kubernetes auth: the ServiceAccount token for a Vault token of `role`."""
        self._client.adapter.namespace = self.opts.effective_auth_namespace or None
        try:
            answer = self._client.auth.kubernetes.login(role=role, jwt=jwt.strip(), mount_point=mount,
                                                         use_token=True)
        except Exception as error:  # translated; never re-raised raw
            self._fail(error, f"log in with kubernetes auth (mount {mount!r}, role {role!r})")
        finally:
            self._client.adapter.namespace = None
        if not isinstance(answer, dict) or not answer.get("auth", {}).get("client_token"):
            raise Internal(f"{self.describe()}: kubernetes auth login (mount {mount!r}, role {role!r}) "
                           "returned no client token")

    def close(self) -> None:
        self._client.adapter.close()
        if self._ca_file is not None:
            try:
                os.unlink(self._ca_file)
            except FileNotFoundError:
                pass
            self._ca_file = None

    # -- the passphrase documents ------------------------------------------------------------

    def put(self, secret_id: str, passphrase: str) -> None:
        document = {"data": {PASSPHRASE_FIELD: passphrase}}
        body = {"data": document} if self._is_kv_v2() else document
        path = self._path(secret_id, "data")
        try:
            self._client.write_data(path, data=body)
        except Exception as error:
            self._fail(error, f"store the passphrase at {path}")

    def get(self, secret_id: str) -> str | None:
        kv_v2 = self._is_kv_v2()
        path = self._path(secret_id, "data")
        try:
            answer = self._client.read(path)
        except Exception as error:
            self._fail(error, f"read the passphrase at {path}")
        if answer is None:
            return None
        data = answer.get("data") if isinstance(answer, dict) else None
        if kv_v2:
            # A soft-deleted (or destroyed) latest version reads as data: null.
            data = data.get("data") if isinstance(data, dict) else None
            if data is None:
                return None
        document = data.get("data") if isinstance(data, dict) else None
        passphrase = document.get(PASSPHRASE_FIELD) if isinstance(document, dict) else None
        if not isinstance(passphrase, str):
            raise Internal(f"{self.describe()}: the secret at {path} has no data.{PASSPHRASE_FIELD} text "
                           "(not written by cephcsi or ceph-csi?)")
        return passphrase

    def delete(self, secret_id: str) -> None:
        """Deleting what is not there succeeds (Vault answers 204 either way)."""
        path = self._path(secret_id, "metadata" if self.opts.destroy_keys else "data")
        try:
            self._client.delete(path)
        except Exception as error:
            self._fail(error, f"delete the passphrase at {path}")

    def read_raw(self, path: str) -> Any:
        """GET /v1/<path> as Vault answers it (for diagnostics and tests)."""
        try:
            return self._client.read(path)
        except Exception as error:
            self._fail(error, f"read {path}")

    # -- helpers -----------------------------------------------------------------------------

    def _path(self, secret_id: str, v2_kind: str) -> str:
        parts = [self.opts.namespace, self.opts.backend_path]
        if self._is_kv_v2():
            parts.append(v2_kind)
        parts.append(secret_id)
        return posixpath.join(*[part.strip("/") for part in parts if part.strip("/")])

    def _is_kv_v2(self) -> bool:
        if self._kv_v2 is None:
            self._kv_v2 = self._mount_is_kv_v2()
        return self._kv_v2

    def _mount_is_kv_v2(self) -> bool:
        wanted = self.opts.backend_path.strip("/")
        self._client.adapter.namespace = self.opts.effective_auth_namespace or None
        try:
            mounts = self._client.read("sys/mounts")
        except Exception as error:
            self._fail(error, "list the secrets engines (to learn the KV version of "
                              f"{self.opts.backend_path!r}; set vaultBackend to skip this)")
        finally:
            self._client.adapter.namespace = None
        table = mounts.get("data", mounts) if isinstance(mounts, dict) else {}
        for mount_path, mount in table.items():
            if isinstance(mount, dict) and mount_path.strip("/") == wanted:
                options = mount.get("options") or {}
                return str(options.get("version", "1")) == "2"
        raise InvalidArgument(f"{self.describe()}: no secrets engine is mounted at {self.opts.backend_path!r} "
                              "(vaultBackendPath)")

    def _fail(self, error: Exception, doing: str) -> NoReturn:
        """Raise the cephcsi error for `error` that happened while `doing`."""
        if isinstance(error, CephCSIError):
            raise error
        where = self.describe()
        if isinstance(error, requests.exceptions.SSLError):
            raise KmsUnavailable(self.kms_id, self.kms_type,
                                 f"TLS with Vault at {self.opts.address} failed, could not {doing} "
                                 "(check vaultCAFromSecret, vaultCAVerify, vaultTLSServerName)") from None
        if isinstance(error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            raise KmsUnavailable(self.kms_id, self.kms_type,
                                 f"cannot reach Vault at {self.opts.address} to {doing}: "
                                 f"{type(error).__name__}") from None
        if isinstance(error, (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized)):
            raise PermissionDenied(f"{where}: Vault refused to {doing}: permission denied "
                                   "(is the token valid, and does its policy allow this path?)") from None
        if isinstance(error, (hvac.exceptions.VaultDown, hvac.exceptions.BadGateway,
                              hvac.exceptions.InternalServerError, hvac.exceptions.RateLimitExceeded)):
            raise KmsUnavailable(self.kms_id, self.kms_type,
                                 f"Vault at {self.opts.address} could not {doing}: {_vault_errors(error)}") from None
        if isinstance(error, hvac.exceptions.VaultError):
            raise Internal(f"{where}: could not {doing}: {_vault_errors(error)}") from None
        raise Internal(f"{where}: could not {doing}: {type(error).__name__}") from None


def _vault_errors(error: hvac.exceptions.VaultError) -> str:
    # Vault's own error texts name paths and reasons, never the request's token.
    errors = getattr(error, "errors", None)
    if isinstance(errors, list) and errors:
        return "; ".join(str(item) for item in errors)
    return type(error).__name__
