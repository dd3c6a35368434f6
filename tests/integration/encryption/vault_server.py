"""A real Vault server for the vault/vaulttokens KMS tests: `vault server -dev` (in-memory
storage, unsealed, root token of our choosing) on 127.0.0.1 (or `host`, e.g. the e2e node IP pods
reach) and a free port.

The binary is built by scripts/build_vault.sh (HashiCorp Vault v1.14.1, MPL-2.0) into
~/.cache/cephcsi/vault/<version>/bin/vault; the fixture skips with a visible reason when it is not
there. Besides dev mode's KV v2 mount at secret/, the server gets a KV v1 mount at kv1/ and a
second KV v2 mount at kv2/, the two shapes ceph-csi's vaultBackend covers.

The tests check what is stored through Vault's own HTTP API (`api`), not through cephcsi.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "scripts" / "build_vault.sh"


def binary_path() -> Path:
    """Where scripts/build_vault.sh puts the binary (without building it: that takes minutes)."""
    match = re.search(r'VAULT_VERSION="\$\{VAULT_VERSION:-([^}]+)\}"', BUILD_SCRIPT.read_text())
    if match is None:
        raise RuntimeError(f"{BUILD_SCRIPT} names no default VAULT_VERSION")
    version = os.environ.get("VAULT_VERSION", match.group(1))
    cache = Path(os.environ.get("CEPHCSI_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                                / "cephcsi"))
    return cache / "vault" / version / "bin" / "vault"


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class VaultServer:
    binary: Path
    work_dir: Path
    root_token: str = field(default_factory=lambda: "root-" + secrets.token_hex(12))
    port: int = 0
    tls: bool = False
    """Serve HTTPS with the certificate dev mode makes (-dev-tls: a CA and a serving certificate
    for localhost and 127.0.0.1)."""
    host: str = "127.0.0.1"
    """The address to listen on (-dev-tls's certificate names only localhost and 127.0.0.1)."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.work_dir / "tls" / "vault-ca.pem"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "vault.log"

    def start(self, timeout: float = 30.0) -> None:
        self.port = self.port or _free_port(self.host)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.work_dir)}
        argv = [str(self.binary), "server", "-dev", f"-dev-listen-address={self.host}:{self.port}",
                f"-dev-root-token-id={self.root_token}", "-dev-no-store-token", "-log-level=warn"]
        if self.tls:
            (self.work_dir / "tls").mkdir(exist_ok=True)
            argv += ["-dev-tls", f"-dev-tls-cert-dir={self.work_dir / 'tls'}"]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vault exited with {self.process.returncode}; see {self.log_file}")
            try:
                if self.api("GET", "sys/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vault did not answer on {self.address} in {timeout}s; see {self.log_file}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def setup_mounts(self) -> None:
        for path, version in (("kv1", "1"), ("kv2", "2")):
            status, body = self.api("POST", f"sys/mounts/{path}", {"type": "kv", "options": {"version": version}})
            if status not in (200, 204):
                raise RuntimeError(f"mounting {path}: {status} {body}")

    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            token: str | None = None) -> tuple[int, Any]:
        """One request to Vault's HTTP API (/v1/<path>) with the root token (or `token`); the
        status and the decoded JSON body (None when empty)."""
        request = urllib.request.Request(
            f"{self.address}/v1/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"X-Vault-Token": token or self.root_token, "Content-Type": "application/json"},
        )
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else None
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as error:
            raw = error.read()
            return error.code, json.loads(raw) if raw else None

    def create_token(self, policy_hcl: str, name: str) -> str:
        """A token limited to one policy (the tests never hand the root token to cephcsi)."""
        status, body = self.api("PUT", f"sys/policies/acl/{name}", {"policy": policy_hcl})
        if status not in (200, 204):
            raise RuntimeError(f"writing policy {name}: {status} {body}")
        status, body = self.api("POST", "auth/token/create", {"policies": [name], "ttl": "1h"})
        if status != 200:
            raise RuntimeError(f"creating a token: {status} {body}")
        return str(body["auth"]["client_token"])
