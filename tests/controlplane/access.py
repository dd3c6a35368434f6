"""Clients, tokens and kubeconfigs for a test control plane (tests/controlplane/cluster.py).

- Non-admin identities: `service_account_client` uses a real TokenRequest token (exactly what a
  pod would present); `impersonating_client` uses admin impersonation, which the RBAC authorizer
  evaluates exactly as if that user had authenticated (handy for token-file-like users without
  restarting the apiserver to re-read tokens.csv).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

import kubernetes.client
import kubernetes.utils
import yaml

ADMIN_USER = "admin"


class ApiAccess:
    """What reaches a running apiserver, given its URL, CA bundle and admin token (the control
    plane that started it provides those)."""

    admin_token: str

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def ca_file(self) -> Path:
        raise NotImplementedError

    def configuration(self, token: str | None = None, host: str | None = None) -> kubernetes.client.Configuration:
        """A client Configuration for this apiserver with the given bearer token (admin by
        default); `host` overrides the URL (e.g. a TcpProxy's)."""
        cfg = kubernetes.client.Configuration()
        cfg.host = host or self.url
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return cfg

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new admin ApiClient (system:masters)."""
        return kubernetes.client.ApiClient(self.configuration())

    def impersonating_client(self, user: str, groups: Sequence[str] = ()) -> kubernetes.client.ApiClient:
        """An ApiClient whose requests are authorized exactly as `user` in `groups` (RBAC applies)."""
        client = kubernetes.client.ApiClient(self.configuration())
        client.set_default_header("Impersonate-User", user)
        # The client sends one header per value only through default_headers of distinct names,
        # so several groups are not expressible here; one group covers the project's needs.
        if len(groups) > 1:
            raise ValueError("impersonating_client supports at most one group")
        for group in groups:
            client.set_default_header("Impersonate-Group", group)
        return client

    def service_account_token(self, namespace: str, name: str, expiration_seconds: int = 3600) -> str:
        """A bound token for ServiceAccount namespace/name via the TokenRequest API; the
        ServiceAccount (and the namespace) are created if missing."""
        with self.api_client() as admin:
            core = kubernetes.client.CoreV1Api(admin)
            create_ignoring_conflict(lambda: core.create_namespace({"metadata": {"name": namespace}}))
            create_ignoring_conflict(
                lambda: core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
            )
            request = {"spec": {"audiences": [], "expirationSeconds": expiration_seconds}}
            reply = core.create_namespaced_service_account_token(name, namespace, request)
            return str(reply.status.token)

    def service_account_client(self, namespace: str, name: str) -> kubernetes.client.ApiClient:
        """An ApiClient authenticated as ServiceAccount namespace/name (created if missing).
        Bind RBAC to the subject system:serviceaccount:<namespace>:<name>."""
        return kubernetes.client.ApiClient(self.configuration(self.service_account_token(namespace, name)))

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path) -> Path:
        """A kubeconfig file authenticating as ServiceAccount namespace/name (for subprocesses
        and for code that takes --kubeconfig)."""
        return self.write_kubeconfig(path, self.service_account_token(namespace, name))

    def apply_manifest(self, path: Path) -> list[dict[str, object]]:
        """Create every object of a (multi-document) YAML manifest as admin; objects that
        already exist are left alone. Returns the documents."""
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        with self.api_client() as admin:
            for doc in docs:
                try:
                    kubernetes.utils.create_from_dict(admin, doc)
                except kubernetes.utils.FailToCreateError as exc:
                    if any(e.status != 409 for e in exc.api_exceptions):
                        raise
        return docs

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """Write a kubeconfig for this apiserver with the given token (admin by default)."""
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "user", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        }
        path.write_text(json.dumps(cfg, indent=2))
        path.chmod(0o600)
        return path


def create_ignoring_conflict(create: Callable[[], object]) -> None:
    """A create that may have been done already (a rerun, another test): 409 is success."""
    try:
        create()
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
