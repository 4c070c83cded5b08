"""A TCP relay on loopback that can cut every connection through it, on cue.

For testing what a client does when its connection drops mid-stream: the
server stays up, the client's socket is reset, as when a proxy or the network
drops it. It also keeps what the clients sent (request heads, for small
requests), so a test can see what a client asked on reconnecting (its
Last-Event-ID).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

REFUSED = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class CuttingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.requests: list[bytes] = []  # every chunk a client sent, in order
        self._open: list[socket.socket] = []
        # Requests whose head holds one of these are answered 502 by the proxy itself, as a
        # proxy that does not pass server-sent events through would.
        self.refuse: set[bytes] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Reset every connection open now (new ones are relayed as before)."""
        with self._lock:
            conns, self._open = self._open, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()  # nothing upstream: the client sees a reset, as it would
                continue
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if record:
                    self.requests.append(data)
                    if any(marker in data for marker in self.refuse):
                        src.sendall(REFUSED)
                        break
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def cutting_proxy(upstream_url: str) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(int(upstream_url.rsplit(":", 1)[1]))
    try:
        yield proxy
    finally:
        proxy.close()
