"""The `vault` and `vaulttokens` KMS types against a real Vault server (vault_server.py).

What is stored is checked through Vault's own HTTP API, in the layout ceph-csi uses
(libopenstorage/secrets): `<mount>/data/<id>` on KV v2 and `<mount>/<id>` on KV v1, the secret's
data being {"data": {"passphrase": ...}}.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from cephcsi.encryption.kms import registry
from cephcsi.encryption.kms.base import KmsUnavailable
from cephcsi.encryption.kms.vault import VaultKms
from cephcsi.encryption.kms.vault_tokens import VaultTokensKms
from cephcsi.errors import FailedPrecondition, PermissionDenied
from tests.integration.encryption.vault_server import VaultServer, _free_port

pytestmark = [pytest.mark.integration]

POLICY = """
path "secret/*" { capabilities = ["create", "read", "update", "delete", "list"] }
path "kv1/*" { capabilities = ["create", "read", "update", "delete", "list"] }
path "kv2/*" { capabilities = ["create", "read", "update", "delete", "list"] }
path "sys/mounts" { capabilities = ["read"] }
"""


def driver_log(caplog: pytest.LogCaptureFixture) -> str:
    """What cephcsi and the libraries under it logged (the test's own Kubernetes client logs the
    tokens it requests at DEBUG: not ours to check)."""
    return "\n".join(record.getMessage() for record in caplog.records
                     if not record.name.startswith("kubernetes."))


def volume_id() -> str:
    # the shape of a CSI volume handle: the secret id is the whole of it
    return f"0001-0009-rook-ceph-0000000000000002-{uuid.uuid4()}"


@pytest.fixture(scope="module")
def token(vault_server: VaultServer) -> str:
    return vault_server.create_token(POLICY, "cephcsi-test")


def vault_kms(server: VaultServer, token: str, **settings: Any) -> VaultKms:
    config = {"encryptionKMSType": "vault", "vaultAddress": server.address, **settings}
    kms = registry.build("vault-test", config, {})
    assert isinstance(kms, VaultKms)
    # ceph-csi's Vault library takes VAULT_TOKEN from the environment before any login
    kms._environ = {"VAULT_TOKEN": token}
    return kms


def test_vault_kv2_round_trip_in_ceph_csi_layout(vault_server: VaultServer, token: str) -> None:
    kms = vault_kms(vault_server, token, vaultBackendPath="secret/", vaultPassphrasePath="ceph-csi/")
    vol = volume_id()
    try:
        assert kms.fetch(vol) is None
        kms.store(vol, "pass-1=")
        status, body = vault_server.api("GET", f"secret/data/ceph-csi/{vol}")
        assert status == 200
        assert body["data"]["data"] == {"data": {"passphrase": "pass-1="}}
        assert kms.fetch(vol) == "pass-1="
        kms.store(vol, "pass-2=")  # a retried CreateVolume replaces, never fails
        assert kms.fetch(vol) == "pass-2="
        kms.remove(vol)
        # vaultDestroyKeys defaults to true: every version is gone, not only soft-deleted
        assert vault_server.api("GET", f"secret/metadata/ceph-csi/{vol}")[0] == 404
        assert kms.fetch(vol) is None
        kms.remove(vol)  # removing again succeeds
    finally:
        kms.close()


def test_vault_kv1_round_trip(vault_server: VaultServer, token: str) -> None:
    # the old spelling vaultPassphraseRoot with its "/v1/" prefix, as ceph-csi's old examples wrote
    kms = vault_kms(vault_server, token, vaultPassphraseRoot="/v1/kv1", vaultBackend="kv")
    vol = volume_id()
    try:
        kms.store(vol, "v1-pass=")
        status, body = vault_server.api("GET", f"kv1/{vol}")
        assert status == 200
        assert body["data"] == {"data": {"passphrase": "v1-pass="}}
        assert kms.fetch(vol) == "v1-pass="
        kms.remove(vol)
        assert vault_server.api("GET", f"kv1/{vol}")[0] == 404
        assert kms.fetch(vol) is None
    finally:
        kms.close()


def test_kv_version_is_asked_from_vault_when_not_configured(vault_server: VaultServer, token: str) -> None:
    v1 = vault_kms(vault_server, token, vaultBackendPath="kv1")
    v2 = vault_kms(vault_server, token, vaultBackendPath="kv2/")
    vol = volume_id()
    try:
        v1.store(vol, "one=")
        v2.store(vol, "two=")
        assert vault_server.api("GET", f"kv1/{vol}")[1]["data"] == {"data": {"passphrase": "one="}}
        assert vault_server.api("GET", f"kv2/data/{vol}")[1]["data"]["data"] == {"data": {"passphrase": "two="}}
    finally:
        v1.remove(vol)
        v2.remove(vol)
        v1.close()
        v2.close()


def test_keys_written_by_ceph_csi_are_read(vault_server: VaultServer, token: str) -> None:
    """A volume ceph-csi created: its passphrase written straight through Vault's API."""
    vol = volume_id()
    vault_server.api("POST", f"secret/data/{vol}", {"data": {"data": {"passphrase": "from-ceph-csi="}}})
    kms = vault_kms(vault_server, token)  # default vaultBackendPath secret/
    try:
        assert kms.fetch(vol) == "from-ceph-csi="
    finally:
        kms.remove(vol)
        kms.close()


def test_vault_destroy_keys_false_soft_deletes(vault_server: VaultServer, token: str) -> None:
    kms = vault_kms(vault_server, token, vaultBackendPath="kv2", vaultDestroyKeys="false")
    vol = volume_id()
    try:
        kms.store(vol, "keep=")
        kms.remove(vol)
        assert kms.fetch(vol) is None
        status, body = vault_server.api("GET", f"kv2/metadata/{vol}")
        assert status == 200, "soft delete keeps the metadata and the deleted version"
        assert body["data"]["versions"]["1"]["deletion_time"]
    finally:
        vault_server.api("DELETE", f"kv2/metadata/{vol}")
        kms.close()


def test_unreachable_vault_is_unavailable_naming_kms_and_address(token: str, caplog: pytest.LogCaptureFixture,
                                                                  tmp_path: Path, vault_server: VaultServer) -> None:
    caplog.set_level(logging.DEBUG)
    server = VaultServer(binary=vault_server.binary, work_dir=tmp_path / "short-lived")
    server.start()
    short_token = server.create_token(POLICY, "short")
    kms = vault_kms(server, short_token, vaultBackend="kv-v2")
    vol = volume_id()
    try:
        kms.store(vol, "stored=")
        server.stop()
        with pytest.raises(KmsUnavailable) as raised:
            kms.fetch(vol)
    finally:
        server.stop()
        kms.close()
    message = str(raised.value)
    assert raised.value.code.name == "UNAVAILABLE"
    assert "'vault-test'" in message and server.address in message
    assert short_token not in message and short_token not in driver_log(caplog)
    # nothing listens at all (a wrong vaultAddress)
    dead = registry.build("vault-dead", {"encryptionKMSType": "vault",
                                         "vaultAddress": f"http://127.0.0.1:{_free_port()}",
                                         "vaultBackend": "kv-v2"}, {})
    assert isinstance(dead, VaultKms)
    dead._environ = {"VAULT_TOKEN": token}
    with pytest.raises(KmsUnavailable, match="vault-dead"):
        dead.store(vol, "x=")
    dead.close()


def test_token_without_policy_is_permission_denied_and_never_shown(
        vault_server: VaultServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    weak = vault_server.create_token('path "nothing/*" { capabilities = ["read"] }', "weak")
    kms = vault_kms(vault_server, weak, vaultBackend="kv-v2")
    try:
        with pytest.raises(PermissionDenied) as raised:
            kms.store(volume_id(), "x=")
    finally:
        kms.close()
    assert "permission denied" in str(raised.value)
    assert weak not in str(raised.value) and weak not in driver_log(caplog)


# -- vaulttokens ---------------------------------------------------------------------------------


class KubeReader:
    """SecretReader + ConfigMapReader over a real kube-apiserver (what the driver's composition
    root is to provide)."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)

    def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        import base64

        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise
        return {key: base64.b64decode(value).decode() for key, value in (secret.data or {}).items()}

    def read_config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise


@pytest.fixture
def kube_reader(control_plane: Any) -> Iterator[KubeReader]:
    with control_plane.api_client() as client:
        yield KubeReader(client)


@pytest.mark.kube
def test_vaulttokens_token_and_tenant_config_from_kubernetes(
        vault_server: VaultServer, token: str, kube_namespace: str, kube_reader: KubeReader,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    settings = {
        "encryptionKMSType": "vaulttokens",
        "vaultAddress": vault_server.address,
        "vaultBackendPath": "secret/",
        "tenantTokenName": "storage-token",
        "tenants": {"someone-else": {"vaultBackendPath": "nowhere/"}},
    }
    vol = volume_id()

    def build() -> VaultTokensKms:
        kms = registry.build("tokens", settings, {}, tenant=kube_namespace, secret_reader=kube_reader)
        assert isinstance(kms, VaultTokensKms)
        return kms

    with pytest.raises(FailedPrecondition, match=f"{kube_namespace}/storage-token"):
        build()
    kube_reader.core.create_namespaced_secret(kube_namespace, {
        "metadata": {"name": "storage-token"}, "stringData": {"token": token}})
    # the tenant moves its keys to the KV v1 mount; vaultRole is not a tenant's to set (ignored)
    kube_reader.core.create_namespaced_config_map(kube_namespace, {
        "metadata": {"name": "ceph-csi-kms-config"},
        "data": {"vaultBackendPath": "kv1/", "vaultBackend": "kv", "tenantTokenName": "other"}})
    kms = build()
    try:
        assert kms.token_name == "storage-token"
        kms.store(vol, "tenant-pass=")
        assert vault_server.api("GET", f"kv1/{vol}")[1]["data"] == {"data": {"passphrase": "tenant-pass="}}
        assert vault_server.api("GET", f"secret/data/{vol}")[0] == 404
        assert kms.fetch(vol) == "tenant-pass="
        kms.remove(vol)
        assert vault_server.api("GET", f"kv1/{vol}")[0] == 404
    finally:
        kms.close()
    assert token not in driver_log(caplog)


def test_vaulttokens_global_tenant_overrides(vault_server: VaultServer, token: str) -> None:
    """Without a Kubernetes ConfigMap reader: the `tenants` section of the global config applies."""

    class SecretsOnly:
        def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
            return {"token": token} if (namespace, name) == ("team-a", "ceph-csi-kms-token") else None

    settings = {"encryptionKMSType": "vaulttokens", "vaultAddress": "http://127.0.0.1:1",
                "tenants": {"team-a": {"vaultAddress": vault_server.address, "vaultBackendPath": "kv2"}}}
    kms = registry.build("tokens", settings, {}, tenant="team-a", secret_reader=SecretsOnly())
    vol = volume_id()
    try:
        kms.store(vol, "a=")
        assert vault_server.api("GET", f"kv2/data/{vol}")[1]["data"]["data"] == {"data": {"passphrase": "a="}}
        kms.remove(vol)
    finally:
        kms.close()


# -- vault with Vault's kubernetes auth --------------------------------------------------------------


@pytest.mark.kube
def test_vault_logs_in_with_the_service_account_token(
        vault_server: VaultServer, control_plane: Any, kube_namespace: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """ceph-csi's `vault` type: the driver's ServiceAccount token is sent to Vault's kubernetes
    auth mount, which has the real kube-apiserver review it (TokenReview)."""
    caplog.set_level(logging.DEBUG)
    mount = f"k8s-{uuid.uuid4().hex[:8]}"
    jwt = control_plane.service_account_token(kube_namespace, "csi-rbdplugin")
    with control_plane.api_client() as admin:
        # Vault reviews a login's JWT with that same JWT (no reviewer token configured)
        kubernetes.client.RbacAuthorizationV1Api(admin).create_cluster_role_binding({
            "metadata": {"name": f"{kube_namespace}-vault-review"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:auth-delegator"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-rbdplugin", "namespace": kube_namespace}]})
    try:
        assert vault_server.api("POST", f"sys/auth/{mount}", {"type": "kubernetes"})[0] in (200, 204)
        status, body = vault_server.api("POST", f"auth/{mount}/config", {
            "kubernetes_host": control_plane.url, "kubernetes_ca_cert": Path(control_plane.ca_file).read_text(),
            "disable_local_ca_jwt": True})
        assert status in (200, 204), body
        vault_server.create_token(POLICY, "cephcsi-k8s")  # writes the policy the role grants
        status, body = vault_server.api("POST", f"auth/{mount}/role/csi-role", {
            "bound_service_account_names": ["csi-rbdplugin"], "bound_service_account_namespaces": [kube_namespace],
            "policies": ["cephcsi-k8s"], "ttl": "10m"})
        assert status in (200, 204), body
        token_file = tmp_path / "token"
        token_file.write_text(jwt)
        settings = {"encryptionKMSType": "vault", "vaultAddress": vault_server.address, "vaultBackend": "kv-v2",
                    "vaultAuthPath": f"/v1/auth/{mount}/login", "vaultRole": "csi-role"}
        kms = VaultKms("vault-k8s", settings, {}, token_path=str(token_file), environ={})
        vol = volume_id()
        try:
            kms.store(vol, "k8s-pass=")
            assert vault_server.api("GET", f"secret/data/{vol}")[1]["data"]["data"] == {
                "data": {"passphrase": "k8s-pass="}}
            assert kms.fetch(vol) == "k8s-pass="
            kms.remove(vol)
        finally:
            kms.close()
        # a role the ServiceAccount is not bound to: refused, and says so
        wrong = VaultKms("vault-k8s", {**settings, "vaultRole": "nope"}, {}, token_path=str(token_file), environ={})
        try:
            with pytest.raises(Exception, match="kubernetes auth.*'nope'") as raised:
                wrong.fetch(vol)
            assert jwt not in str(raised.value)
        finally:
            wrong.close()
    finally:
        vault_server.api("DELETE", f"sys/auth/{mount}")
        with control_plane.api_client() as admin:
            kubernetes.client.RbacAuthorizationV1Api(admin).delete_cluster_role_binding(
                f"{kube_namespace}-vault-review")
    assert jwt not in driver_log(caplog)


# -- TLS ------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # vaultCAVerify "false" on purpose
def test_tls_ca_from_secret_and_server_name(vault_server: VaultServer, tmp_path: Path) -> None:
    """vaultCAFromSecret (a key of the call's secrets for `vault`), vaultTLSServerName and
    vaultCAVerify against a Vault serving HTTPS with its own CA."""
    server = VaultServer(binary=vault_server.binary, work_dir=tmp_path / "tls-vault", tls=True)
    server.start()
    try:
        tls_token = server.create_token(POLICY, "tls")
        ca = server.ca_file.read_text()
        base = {"encryptionKMSType": "vault", "vaultAddress": server.address, "vaultBackend": "kv-v2"}

        def kms(secrets: dict[str, str], **settings: str) -> VaultKms:
            built = registry.build("vault-tls", {**base, **settings}, secrets)
            assert isinstance(built, VaultKms)
            built._environ = {"VAULT_TOKEN": tls_token}
            return built

        vol = volume_id()
        good = kms({"vault-ca": ca}, vaultCAFromSecret="vault-ca", vaultTLSServerName="localhost")
        try:
            good.store(vol, "tls=")
            assert good.fetch(vol) == "tls="
        finally:
            good.close()
        # the certificate is checked against vaultTLSServerName, not the address's host
        wrong_name = kms({"vault-ca": ca}, vaultCAFromSecret="vault-ca", vaultTLSServerName="not-vault.example")
        unknown_ca = kms({})
        try:
            for refused in (wrong_name, unknown_ca):
                with pytest.raises(KmsUnavailable, match="TLS with Vault at https://127.0.0.1"):
                    refused.fetch(vol)
        finally:
            wrong_name.close()
            unknown_ca.close()
        unverified = kms({}, vaultCAVerify="false")
        try:
            assert unverified.fetch(vol) == "tls="
            unverified.remove(vol)
        finally:
            unverified.close()
    finally:
        server.stop()
