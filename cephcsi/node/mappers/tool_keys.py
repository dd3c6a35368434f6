"""Whether this node's Ceph tools can read a key, asked before they are given it.

`check` refuses an aes256k key the local `rbd`/`rbd-fuse` cannot decode (they would print it),
naming the cipher, the tools' version and the ways out; asked once per mapper.
docs/design/node.md, "Can the tools read the key?".
"""
from __future__ import annotations

import threading

from cephcsi.ceph import cephx_keys
from cephcsi.ceph.credentials import Credentials
from cephcsi.node.exec import CommandFailed, Runner

PROBE_TIMEOUT = 30.0


class ToolKeys:
    def __init__(self, runner: Runner, timeout: float = PROBE_TIMEOUT) -> None:
        self._run = runner
        self._timeout = timeout
        self._client: cephx_keys.Client | None = None
        self._lock = threading.Lock()

    def check(self, credentials: Credentials) -> None:
        """FailedPrecondition when the tools cannot read this key (they must never see it then)."""
        info = credentials.key_info
        if info.cipher == cephx_keys.AES:
            return
        cephx_keys.check_usable(info, self.client())

    def client(self) -> cephx_keys.Client:
        with self._lock:
            if self._client is None:
                self._client = self._probe()
            return self._client

    def _probe(self) -> cephx_keys.Client:
        version = self._run(["rbd", "--version"], what="ask the rbd tool its Ceph version", timeout=self._timeout)
        try:
            # -c /dev/null: the answer is the tool's own schema, not a ceph.conf the node may hold.
            self._run(["rbd", "-c", "/dev/null", "--show-config-value", cephx_keys.AES256K_MARKER_OPTION],
                      what="ask the rbd tool whether it reads aes256k keys", timeout=self._timeout)
            reads = True
        except CommandFailed:
            reads = False  # "option not found": a client from before aes256k
        return cephx_keys.Client("the node's Ceph tools (rbd, rbd-fuse)", cephx_keys.parse_version(version.stdout), reads)
