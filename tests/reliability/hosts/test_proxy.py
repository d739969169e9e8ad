"""The fault proxy the cross-host suite puts between the workers and the store."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from .proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError):  # the proxy resets some
            while data := self.request.recv(4096):
                self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ("127.0.0.1", int(server.server_address[1]))
    finally:
        server.shutdown()
        server.server_close()


def _exchanges(port: int, n: int) -> int:
    """Send and read back ``n`` messages; how many came back before a reset."""
    done = 0
    try:  # a refused connection may be reset while it is still being made
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            for i in range(n):
                message = f"message {i}\n".encode()
                conn.sendall(message)
                got = b""
                while len(got) < len(message):
                    chunk = conn.recv(4096)
                    if not chunk:
                        return done
                    got += chunk
                assert got == message
                done += 1
    except ConnectionResetError:
        pass
    return done


def test_every_round_trip_is_longer_by_twice_the_delay(echo: tuple[str, int]) -> None:
    with FaultProxy("127.0.0.1", echo, delay=0.1) as proxy:
        began = time.monotonic()
        assert _exchanges(proxy.port, 3) == 3
        assert time.monotonic() - began >= 3 * 0.2


def test_one_connection_in_n_is_reset_mid_stream(echo: tuple[str, int]) -> None:
    with FaultProxy("127.0.0.1", echo, drop_every=4, seed=7) as proxy:
        carried = [_exchanges(proxy.port, 20) for _ in range(8)]
    broken = [n for n in carried if n < 20]
    assert len(broken) == 2 == len(proxy.stats.drops)
    # mid-stream: each reset connection had carried a few exchanges first
    assert all(n >= 2 for n in broken)
    assert proxy.stats.connections == 8


def test_the_proxy_refuses_connections_beyond_its_bound(echo: tuple[str, int]) -> None:
    with FaultProxy("127.0.0.1", echo, max_connections=1) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as first:
            first.sendall(b"hold\n")
            assert first.recv(16) == b"hold\n"
            assert _exchanges(proxy.port, 1) == 0
        assert proxy.stats.refused == 1
