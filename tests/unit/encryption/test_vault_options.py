"""Pure logic of the vault/vaulttokens KMS types: ConfigMap options, paths, old formats.
The requests themselves are tested against a real Vault in tests/integration/encryption."""
from __future__ import annotations

from pathlib import Path

import pytest

from cephcsi.encryption.kms import registry
from cephcsi.encryption.kms.base import KmsArgs
from cephcsi.encryption.kms.vault import VaultKms, auth_mount_path
from cephcsi.encryption.kms.vault_common import VaultKv, VaultOptions, apply_options
from cephcsi.encryption.kms.vault_tokens import VaultTokensKms, convert_old_format
from cephcsi.errors import FailedPrecondition, InvalidArgument

pytestmark = pytest.mark.unit


def test_defaults_are_ceph_csis() -> None:
    opts = apply_options("k", None, {"vaultAddress": "https://vault:8200/"})
    assert opts == VaultOptions(address="https://vault:8200", backend="", backend_path="secret/",
                                destroy_keys=True, ca_verify=True)
    assert opts.effective_auth_namespace == ""


def test_address_is_required_and_checked() -> None:
    with pytest.raises(InvalidArgument, match="'k'.*vaultAddress.*required"):
        apply_options("k", None, {})
    with pytest.raises(InvalidArgument, match="http:// or https://"):
        apply_options("k", None, {"vaultAddress": "vault:8200"})
    with pytest.raises(InvalidArgument, match="'vaultBackendPath' must be a string"):
        apply_options("k", None, {"vaultAddress": "http://v", "vaultBackendPath": 3})


def test_options_and_overrides() -> None:
    base = apply_options("k", None, {"vaultAddress": "http://a", "vaultBackend": "kv-v2", "vaultDestroyKeys": "no",
                                     "vaultCAVerify": False, "vaultNamespace": "ns1"})
    assert (base.backend, base.destroy_keys, base.ca_verify, base.effective_auth_namespace) == ("kv-v2", False, False,
                                                                                                "ns1")
    tenant = apply_options("k", base, {"vaultAddress": "https://b", "vaultCAVerify": "true",
                                       "vaultAuthNamespace": "auth"})
    assert (tenant.address, tenant.backend, tenant.ca_verify, tenant.namespace, tenant.effective_auth_namespace) == (
        "https://b", "kv-v2", True, "ns1", "auth")
    with pytest.raises(InvalidArgument, match="vaultBackend"):
        apply_options("k", base, {"vaultBackend": "transit"})
    with pytest.raises(InvalidArgument, match="vaultCAVerify.*true or false"):
        apply_options("k", base, {"vaultCAVerify": "maybe"})


@pytest.mark.parametrize(("auth_path", "mount"), [
    ("/v1/auth/kubernetes/login", "kubernetes"),
    ("/v1/auth/cluster/k8s/login", "cluster/k8s"),
    ("kubernetes", "kubernetes"),
])
def test_auth_mount_path(auth_path: str, mount: str) -> None:
    assert auth_mount_path("k", auth_path) == mount


@pytest.mark.parametrize(("backend", "namespace", "kind", "expected"), [
    ("kv-v2", "", "data", "secret/data/ceph-csi/vol-1"),
    ("kv-v2", "", "metadata", "secret/metadata/ceph-csi/vol-1"),
    ("kv", "", "data", "secret/ceph-csi/vol-1"),
    ("kv-v2", "team/", "data", "team/secret/data/ceph-csi/vol-1"),
])
def test_secret_paths(backend: str, namespace: str, kind: str, expected: str) -> None:
    kms = VaultKms("k", {"vaultAddress": "http://v", "vaultBackend": backend, "vaultNamespace": namespace,
                         "vaultPassphrasePath": "ceph-csi/"}, {})
    try:
        assert kms.kv._path(kms.secret_id("vol-1"), kind) == expected
    finally:
        kms.close()


def test_ca_from_call_secrets_is_a_file_removed_on_close() -> None:
    kms = VaultKms("k", {"vaultAddress": "https://v", "vaultCAFromSecret": "vault-ca"}, {"vault-ca": "PEM"})
    ca_file = kms.kv._ca_file
    assert ca_file is not None and Path(ca_file).read_text() == "PEM"
    kms.close()
    assert not Path(ca_file).exists()
    with pytest.raises(InvalidArgument, match="vault-ca"):
        VaultKms("k", {"vaultAddress": "https://v", "vaultCAFromSecret": "vault-ca"}, {})


def test_kubernetes_login_without_a_service_account_token_is_refused(tmp_path: Path) -> None:
    kms = VaultKms("k", {"vaultAddress": "http://127.0.0.1:1", "vaultBackend": "kv-v2"}, {},
                   token_path=str(tmp_path / "missing"), environ={})
    try:
        with pytest.raises(FailedPrecondition, match="ServiceAccount token.*VAULT_TOKEN"):
            kms.fetch("vol")
    finally:
        kms.close()


def test_old_format_is_converted() -> None:
    converted = convert_old_format({"KMS_PROVIDER": "vaulttokens", "VAULT_ADDR": "http://v", "VAULT_BACKEND_PATH": "kv/",
                                    "VAULT_SKIP_VERIFY": "true", "unrelated": "x"})
    assert converted == {"encryptionKMSType": "vaulttokens", "vaultAddress": "http://v", "vaultBackendPath": "kv/",
                         "vaultCAVerify": "false", "vaultDestroyKeys": "true", "vaultNamespace": ""}


class Secrets:
    def __init__(self, data: dict[tuple[str, str], dict[str, str]]) -> None:
        self.data = data

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.data.get((namespace, name))


def test_vaulttokens_needs_tenant_and_token() -> None:
    settings = {"encryptionKMSType": "vaulttokens", "vaultAddress": "http://v"}
    with pytest.raises(InvalidArgument, match="no tenant"):
        VaultTokensKms(KmsArgs("t", settings, tenant="", secret_reader=Secrets({})))
    with pytest.raises(FailedPrecondition, match="team/ceph-csi-kms-token.*does not exist"):
        VaultTokensKms(KmsArgs("t", settings, tenant="team", secret_reader=Secrets({})))
    with pytest.raises(FailedPrecondition, match="no 'token' key"):
        VaultTokensKms(KmsArgs("t", settings, tenant="team",
                               secret_reader=Secrets({("team", "ceph-csi-kms-token"): {"x": "y"}})))
    with pytest.raises(FailedPrecondition, match="Kubernetes API"):
        VaultTokensKms(KmsArgs("t", settings, tenant="team"))
    with pytest.raises(InvalidArgument, match="vaultClientCertFromSecret"):
        VaultTokensKms(KmsArgs("t", {**settings, "vaultClientCertFromSecret": "c"}, tenant="team",
                               secret_reader=Secrets({})))


def test_vaulttokens_ca_from_tenant_then_driver_namespace() -> None:
    settings = {"encryptionKMSType": "vaulttokens", "vaultAddress": "https://v", "vaultCAFromSecret": "vault-ca"}
    reader = Secrets({("team", "ceph-csi-kms-token"): {"token": "s.x"}, ("csi", "vault-ca"): {"cert": "DRIVER-PEM"}})
    kms = VaultTokensKms(KmsArgs("t", settings, tenant="team", namespace="csi", secret_reader=reader))
    try:
        assert kms.kv._ca_file is not None and Path(kms.kv._ca_file).read_text() == "DRIVER-PEM"
    finally:
        kms.close()
    with pytest.raises(FailedPrecondition, match="neither in the tenant's namespace 'team' nor"):
        VaultTokensKms(KmsArgs("t", settings, tenant="team", namespace="elsewhere", secret_reader=reader))


def test_registered() -> None:
    assert {"vault", "vaulttokens"} <= set(registry.known_types())
    kms = registry.build("v", {"encryptionKMSType": "vault", "vaultAddress": "http://v"}, {})
    try:
        assert isinstance(kms, VaultKms) and not kms.dek_in_image
        assert isinstance(kms.kv, VaultKv)
    finally:
        kms.close()
