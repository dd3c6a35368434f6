"""One child process of a test cluster (etcd, kube-apiserver, a kubelet, containerd...) with its
log file; shared by the loopback control plane (tests.controlplane.cluster) and the e2e node
(tests.e2e), so every process they start behaves the same way.

Children get PR_SET_PDEATHSIG(SIGKILL) when started from the main thread, so a test process that
dies hard does not leave an apiserver behind. (The death signal follows the *thread* that forked,
so it is not set for starts from other threads; stop() covers the normal path.)
"""
from __future__ import annotations

import ctypes
import logging
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Proc:
    """One child process and its log file."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None

    def start(self) -> None:
        self.log_file = open(self.log_path, "ab")
        preexec = _set_pdeathsig if threading.current_thread() is threading.main_thread() else None
        self.popen = subprocess.Popen(  # noqa: S603 - argv built from our own paths
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )
        log.info("started %s", self.name, extra={"pid": self.popen.pid, "log": str(self.log_path)})

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, graceful: bool = True, timeout: float = 20.0) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM; killing", self.name)
                self.popen.kill()
                self.popen.wait(timeout=10)
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
