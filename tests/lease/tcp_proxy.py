"""A loopback TCP proxy that can cut the line: a real network outage on demand.

While cut, open connections are closed and new ones are accepted and closed
at once, so clients see real driver errors (and reconnect afterwards), while
the server itself keeps running for everyone else.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``target``; ``cut()`` and ``restore()`` the line."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """Drop every open connection and refuse service until :meth:`restore`."""
        self._cut.set()
        with self._lock:
            socks, self._open = self._open, set()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closing.set()
        self.cut()
        self._listener.close()
        self._thread.join(5)

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.05)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._cut.is_set():
                ready, _, _ = select.select(list(peers), [], [], 0.05)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._open.discard(a)
                self._open.discard(b)
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
