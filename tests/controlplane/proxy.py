"""A loopback TCP proxy that can cut or black-hole a client's path to the API server.

Tests point one client (an informer's, an elector's) at the proxy and keep the admin client
direct, so they can simulate a network partition for that client only while changing objects,
compacting etcd, etc. The proxy forwards raw bytes, so TLS is end to end; the apiserver's
certificate is valid for 127.0.0.1 on any port.

Modes: "pass" forwards; "cut" resets every connection and refuses new ones (like a crashed
peer); "blackhole" accepts connections but moves no bytes either way (like a dropped route,
so clients see timeouts, not errors).
"""
from __future__ import annotations

import logging
import selectors
import socket
import threading

log = logging.getLogger(__name__)


class TcpProxy:
    """See the module docstring."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._mode = "pass"
        self._pairs: dict[socket.socket, socket.socket] = {}
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name=f"tcp-proxy-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """https URL of the proxied apiserver."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        """Current mode."""
        with self._lock:
            return self._mode

    def start(self) -> TcpProxy:
        """Start forwarding."""
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()
        return self

    def cut(self) -> None:
        """Reset all connections and refuse new ones until restore()."""
        self._set_mode("cut")

    def blackhole(self) -> None:
        """Stop moving bytes (connections hang) until restore()."""
        self._set_mode("blackhole")

    def restore(self) -> None:
        """Forward again (connections cut meanwhile stay closed)."""
        self._set_mode("pass")

    def stop(self) -> None:
        """Close everything."""
        self._stop.set()
        self._wake_w.send(b"x")
        self._thread.join(5)
        for sock in list(self._pairs):
            _close(sock)
        _close(self._listener)
        _close(self._wake_r)
        _close(self._wake_w)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _set_mode(self, mode: str) -> None:
        with self._lock:
            self._mode = mode
        self._wake_w.send(b"x")

    def _run(self) -> None:
        applied = "pass"
        while not self._stop.is_set():
            mode = self.mode
            if mode != applied:
                self._apply(mode)
                applied = mode
            for key, _events in self._selector.select(timeout=0.5):
                if key.data == "wake":
                    self._wake_r.recv(4096)
                elif key.data == "accept":
                    self._accept(mode)
                elif mode == "pass":
                    self._pump(key.fileobj)  # type: ignore[arg-type]

    def _apply(self, mode: str) -> None:
        if mode == "cut":
            for sock in list(self._pairs):
                self._drop(sock, reset=True)
        for sock in list(self._pairs):
            # In blackhole mode nothing is read, so the selector must not report readiness.
            events = selectors.EVENT_READ if mode == "pass" else 0
            try:
                if events:
                    self._selector.modify(sock, events, "data")
                else:
                    self._selector.unregister(sock)
            except (KeyError, ValueError):
                if events:
                    self._selector.register(sock, events, "data")

    def _accept(self, mode: str) -> None:
        try:
            client, _addr = self._listener.accept()
        except BlockingIOError:
            return
        if mode == "cut":
            _reset(client)
            return
        if mode == "blackhole":
            # Hold the connection without talking to anyone.
            upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._pairs[client] = upstream
            self._pairs[upstream] = client
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        for sock in (client, upstream):
            sock.setblocking(False)
        self._pairs[client] = upstream
        self._pairs[upstream] = client
        self._selector.register(client, selectors.EVENT_READ, "data")
        self._selector.register(upstream, selectors.EVENT_READ, "data")

    def _pump(self, sock: socket.socket) -> None:
        peer = self._pairs.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock, reset=False)
            return
        try:
            peer.setblocking(True)
            peer.sendall(data)
            peer.setblocking(False)
        except OSError:
            self._drop(sock, reset=True)

    def _drop(self, sock: socket.socket, reset: bool) -> None:
        peer = self._pairs.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._pairs.pop(s, None)
            try:
                self._selector.unregister(s)
            except (KeyError, ValueError):
                pass
            if reset:
                _reset(s)
            else:
                _close(s)


def _reset(sock: socket.socket) -> None:
    # SO_LINGER 0 makes close() send RST: the client sees "connection reset" at once.
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
