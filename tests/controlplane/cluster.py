"""Start and stop a real etcd + kube-apiserver (+ optional kube-controller-manager) on loopback.

Used by the pytest fixtures (tests/controlplane/fixtures.py), by the benchmarks and by the
hand-run script (`python -m tests.controlplane.run`). Everything lives in one work directory:
etcd data, the apiserver's self-signed serving certificate, the service-account key pair, the
static token file, the admin kubeconfig and one log file per process.

Design notes and limits:
- Ports are picked by binding port 0 and closing the socket, so two runs on one machine do not
  collide; the small window in which another process could take the port is covered by retrying
  the whole start with fresh ports.
- The apiserver is restarted on the same port (clients keep their URL); its serving certificate
  survives because --cert-dir is kept.
- Each process is a tests.controlplane.process.Proc: its own log file, and it dies with the test
  process (see that module for the limits).
- Clients and non-admin identities: tests/controlplane/access.py.
"""
from __future__ import annotations

import json
import logging
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tests.controlplane.access import ADMIN_USER, ApiAccess
from tests.controlplane.process import Proc

log = logging.getLogger(__name__)

BUILD_SCRIPT = Path(__file__).with_name("build.sh")
SERVICE_CIDR = "10.0.0.0/24"


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached."""


@dataclass(frozen=True)
class ControlPlaneSettings:
    """How to start the control plane."""

    bin_dir: Path | None = None
    """Folder with etcd, kube-apiserver, kube-controller-manager; None → run build.sh (cached)."""
    work_dir: Path | None = None
    """Where data, keys, certs and logs go; None → a fresh temporary folder removed on stop()."""
    start_timeout: float = 90.0
    """Seconds to wait for etcd health and apiserver /readyz."""
    extra_apiserver_args: tuple[str, ...] = ()
    """Appended to the kube-apiserver command line."""
    watch_cache_sizes: str = "podtemplates#0"
    """--watch-cache-sizes value. PodTemplates bypass the watch cache by default, so a watch on
    them reaches etcd and etcd compaction really produces 410 Gone (the watch cache would
    otherwise keep serving old resourceVersions); no controller touches PodTemplates."""


def binaries_dir(timeout: float = 3600.0) -> Path:
    """Run build.sh (a no-op once built; it takes a flock) and return the bin folder it prints."""
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise ControlPlaneError(f"{BUILD_SCRIPT} printed no bin folder")
    return Path(lines[-1].strip())


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ControlPlane(ApiAccess):
    """A running etcd + kube-apiserver; see the module docstring. Clients, tokens and
    kubeconfigs for it: tests.controlplane.access.ApiAccess."""

    settings: ControlPlaneSettings
    bin_dir: Path
    work_dir: Path
    owns_work_dir: bool
    etcd_port: int = 0
    etcd_peer_port: int = 0
    apiserver_port: int = 0
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    _etcd: Proc | None = None
    _apiserver: Proc | None = None
    _kcm: Proc | None = None

    # ---- addresses and credentials -------------------------------------------------------

    @property
    def url(self) -> str:
        """The apiserver URL (https://127.0.0.1:PORT)."""
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        """The etcd client URL (plain http on loopback)."""
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca_file(self) -> Path:
        """The apiserver's self-signed serving certificate bundle (use as CA)."""
        return self.work_dir / "pki" / "apiserver.crt"

    @property
    def token(self) -> str:
        """The admin bearer token (group system:masters)."""
        return self.admin_token

    @property
    def kubeconfig(self) -> Path:
        """An admin kubeconfig for this control plane."""
        return self.work_dir / "admin.kubeconfig"

    @property
    def sa_key(self) -> Path:
        """The service-account signing key (private)."""
        return self.work_dir / "sa.key"

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start etcd and the apiserver on fresh ports; retry with new ports if one was taken."""
        self._prepare_files()
        last: Exception | None = None
        for _attempt in range(3):
            self.etcd_port, self.etcd_peer_port, self.apiserver_port = free_port(), free_port(), free_port()
            try:
                self._start_etcd()
                self.start_apiserver()
                self._write_kubeconfig()
                return
            except ControlPlaneError as exc:
                last = exc
                log.warning("control plane start failed, retrying with new ports: %s", exc)
                self.stop_processes()
                shutil.rmtree(self.work_dir / "etcd", ignore_errors=True)
        raise ControlPlaneError(f"control plane did not start: {last}")

    def stop_processes(self) -> None:
        """Stop kcm, apiserver and etcd (in that order); safe to call twice."""
        for proc in (self._kcm, self._apiserver, self._etcd):
            if proc is not None:
                proc.stop(graceful=False, timeout=10)

    def stop(self) -> None:
        """Stop every process and remove the work folder if we created it."""
        self.stop_processes()
        if self.owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- apiserver ----------------------------------------------------------------------------

    def start_apiserver(self) -> None:
        """Start (or start again) kube-apiserver on its port and wait for /readyz."""
        if self._apiserver is not None and self._apiserver.running():
            return
        self._apiserver = Proc("kube-apiserver", self._apiserver_argv(), self.work_dir / "kube-apiserver.log")
        self._apiserver.start()
        self._wait_ready(self._apiserver)

    def _apiserver_argv(self) -> list[str]:
        """kube-apiserver's command line; a subclass serving elsewhere overrides it."""
        argv = [
            *self._apiserver_base_argv("127.0.0.1"),
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            # Tests restart the apiserver; do not let it wait for long-running requests.
            "--shutdown-delay-duration=0s",
            "--v=1",
        ]
        if self.settings.watch_cache_sizes:
            argv.append(f"--watch-cache-sizes={self.settings.watch_cache_sizes}")
        argv.extend(self.settings.extra_apiserver_args)
        return argv

    def _apiserver_base_argv(self, address: str) -> list[str]:
        """What every test apiserver has: this etcd, one address, the kept --cert-dir, the
        service-account key pair, the admin token file and RBAC."""
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={address}",
            f"--advertise-address={address}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.work_dir / 'pki'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={self.work_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.sa_key}",
            f"--token-auth-file={self.work_dir / 'tokens.csv'}",
            "--authorization-mode=RBAC",
        ]

    def stop_apiserver(self, graceful: bool = True) -> None:
        """Stop kube-apiserver (SIGTERM, or SIGKILL when graceful=False); etcd keeps running."""
        if self._apiserver is not None:
            self._apiserver.stop(graceful=graceful)

    def restart_apiserver(self, graceful: bool = True) -> None:
        """Stop and start kube-apiserver on the same port."""
        self.stop_apiserver(graceful=graceful)
        self.start_apiserver()

    def apiserver_running(self) -> bool:
        """True while the kube-apiserver process is alive."""
        return self._apiserver is not None and self._apiserver.running()

    # ---- kube-controller-manager ----------------------------------------------------------------

    def start_controller_manager(self, controllers: Sequence[str]) -> None:
        """(Re)start kube-controller-manager with exactly these --controllers."""
        self.stop_controller_manager()
        argv = [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            "--leader-elect=false",
            "--secure-port=0",
            f"--controllers={','.join(controllers)}",
            f"--service-account-private-key-file={self.sa_key}",
            f"--root-ca-file={self.ca_file}",
            "--v=1",
        ]
        self._kcm = Proc("kube-controller-manager", argv, self.work_dir / "kube-controller-manager.log")
        self._kcm.start()
        time.sleep(0.5)
        if not self._kcm.running():
            raise ControlPlaneError(f"kube-controller-manager exited at once:\n{self._kcm.log_tail()}")

    def stop_controller_manager(self) -> None:
        """Stop kube-controller-manager if it runs."""
        if self._kcm is not None:
            self._kcm.stop()
            self._kcm = None

    # ---- etcd ----------------------------------------------------------------------------------

    def etcd_revision(self) -> int:
        """The current etcd revision (the newest resourceVersion of any object)."""
        return int(self._etcd_call("/v3/maintenance/status", {})["header"]["revision"])

    def compact_etcd(self) -> int:
        """Compact etcd to its current revision (physically), so any older resourceVersion
        given to a watch that reaches etcd gets 410 Gone. Returns the revision."""
        revision = self.etcd_revision()
        self._etcd_call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ---- internals ----------------------------------------------------------------------------------

    def _prepare_files(self) -> None:
        (self.work_dir / "pki").mkdir(parents=True, exist_ok=True)
        if not self.sa_key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(self.sa_key), "2048"],
                           check=True, capture_output=True)
            subprocess.run(["openssl", "rsa", "-in", str(self.sa_key), "-pubout",
                            "-out", str(self.work_dir / "sa.pub")], check=True, capture_output=True)
            self.sa_key.chmod(0o600)
        tokens = self.work_dir / "tokens.csv"
        tokens.write_text(f'{self.admin_token},{ADMIN_USER},admin-uid,"system:masters"\n')
        tokens.chmod(0o600)

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig)

    def _start_etcd(self) -> None:
        data = self.work_dir / "etcd"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        argv = [
            str(self.bin_dir / "etcd"),
            f"--data-dir={data}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
        self._etcd = Proc("etcd", argv, self.work_dir / "etcd.log")
        self._etcd.start()
        deadline = time.monotonic() + self.settings.start_timeout
        while time.monotonic() < deadline:
            if not self._etcd.running():
                raise ControlPlaneError(f"etcd exited:\n{self._etcd.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as reply:
                    if json.load(reply).get("health") == "true":
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise ControlPlaneError(f"etcd not healthy in {self.settings.start_timeout}s:\n{self._etcd.log_tail()}")

    def _wait_ready(self, proc: Proc) -> None:
        deadline = time.monotonic() + self.settings.start_timeout
        while time.monotonic() < deadline:
            if not proc.running():
                raise ControlPlaneError(f"kube-apiserver exited:\n{proc.log_tail()}")
            if self.ca_file.exists() and self._readyz():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"kube-apiserver not ready in {self.settings.start_timeout}s:\n{proc.log_tail()}")

    def _readyz(self) -> bool:
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            request = urllib.request.Request(
                f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
            )
            with urllib.request.urlopen(request, timeout=2, context=context) as reply:
                return bool(reply.status == 200)
        except (OSError, ssl.SSLError, urllib.error.URLError):
            return False

    def _etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.etcd_url}{path}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            result: dict[str, Any] = json.load(reply)
            return result


def start_control_plane(settings: ControlPlaneSettings | None = None) -> ControlPlane:
    """Build (if needed) and start a control plane; the caller must call .stop() (or use `with`)."""
    settings = settings or ControlPlaneSettings()
    bin_dir = settings.bin_dir or binaries_dir()
    if settings.work_dir is None:
        work_dir, owns = Path(tempfile.mkdtemp(prefix="cephcsi-cp-")), True
    else:
        work_dir, owns = settings.work_dir, False
        work_dir.mkdir(parents=True, exist_ok=True)
    plane = ControlPlane(settings=settings, bin_dir=bin_dir, work_dir=work_dir, owns_work_dir=owns)
    try:
        plane.start()
    except BaseException:
        plane.stop()
        raise
    return plane


__all__ = [
    "ControlPlane",
    "ControlPlaneError",
    "ControlPlaneSettings",
    "binaries_dir",
    "free_port",
    "start_control_plane",
]
