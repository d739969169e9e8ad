"""Serving the run page: who may reach it, and the waitress server that serves it.

Safe by default. The page shows every run's input, output and errors, so
it binds beyond loopback (any host but ``127.0.0.1``, ``::1`` and
``localhost``) only with a permission hook or an explicit
``allow_remote``. Without a hook its visitors are trusted by the network
(only this machine reaches loopback): then it is read-only unless
``allow_actions``, and it answers only requests addressed to a loopback
name (:class:`HostGuard`), so a web page elsewhere cannot reach it by
pointing its own domain at 127.0.0.1 (DNS rebinding).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
"""The hosts the page binds to with no permission hook and no ``allow_remote``."""

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class RemoteBindError(ValueError):
    """Binding beyond loopback was asked without a permission hook or ``allow_remote``."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is one of :data:`LOOPBACK_HOSTS` (``[::1]`` counts)."""
    return host.strip().strip("[]").lower() in LOOPBACK_HOSTS


@dataclass(frozen=True)
class Exposure:
    """How open the served page is: checked once, before anything binds."""

    host: str
    has_permission: bool
    allow_remote: bool
    allow_actions: bool

    def check(self) -> None:
        """Raise :class:`RemoteBindError` for a bind beyond loopback that
        nothing guards; its message says what to pass."""
        if is_loopback(self.host) or self.has_permission or self.allow_remote:
            return
        raise RemoteBindError(
            f"refusing to serve the run page on {self.host!r}: without a permission hook, "
            "anyone who can reach that address would read every run's input, output and "
            "errors. Bind to 127.0.0.1 (the default), pass --permission MODULE:ATTR (a "
            "permission(action, target) -> bool hook), or --allow-remote to serve it "
            "unguarded on purpose (behind a proxy that authenticates)"
        )

    @property
    def guard_hosts(self) -> bool:
        """Whether only loopback ``Host`` headers are answered (no hook, on loopback)."""
        return not self.has_permission and is_loopback(self.host)

    def describe(self) -> str:
        """One line on who may do what, for the operator starting the server."""
        if self.has_permission:
            return "access: the permission hook decides every read and action"
        steer = (
            "cancel, retry and signal allowed (--allow-actions)"
            if self.allow_actions
            else "read-only (pass --allow-actions to cancel, retry and signal from the page)"
        )
        reach = "anyone who reaches it" if not is_loopback(self.host) else "this machine only"
        return f"access: {reach}, {steer}"


class HostGuard:
    """WSGI middleware: answer only requests whose ``Host`` is a loopback name.

    A browser sends the name it resolved in ``Host``: a rebinding page's
    requests carry its own domain and get a 421, with nothing read.
    """

    def __init__(self, app: WsgiApp) -> None:
        self.app = app

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Pass a loopback-addressed request on; refuse any other."""
        host = environ.get("HTTP_HOST") or environ.get("SERVER_NAME") or ""
        if host.startswith("["):
            name = host[1 : host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0]
        if is_loopback(name):
            return self.app(environ, start_response)
        body = (
            b'{"error": "misdirected_request", "message": "this server answers only '
            b'requests addressed to 127.0.0.1, localhost or [::1]"}'
        )
        start_response(
            "421 Misdirected Request",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]


class Server:
    """The page's waitress server: ``run()`` serves until ``close()`` (from
    any thread) closes the listening socket and every open connection."""

    def __init__(self, app: WsgiApp, host: str, port: int, threads: int = 4) -> None:
        from waitress.server import create_server  # type: ignore[import-untyped]

        self._sockets: dict[int, Any] = {}  # waitress's socket map, ours to close
        self._server = create_server(
            app, map=self._sockets, host=host, port=port, threads=threads, ident="pikku-celery"
        )

    @property
    def port(self) -> int:
        """The port it listens on (the one the OS chose for port 0)."""
        return int(self._server.effective_port)

    def run(self) -> None:
        """Serve until :meth:`close` (or Ctrl-C)."""
        self._server.run()

    def serve_until_interrupted(self) -> None:
        """Serve until Ctrl-C (or :meth:`close`), then close: a command's main loop."""
        try:
            self.run()
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def close(self) -> None:
        """Stop listening, drop kept-alive connections, end the worker threads."""
        from waitress import wasyncore  # type: ignore[import-untyped]

        self._server.close()
        wasyncore.close_all(self._sockets)
        self._server.task_dispatcher.shutdown()


def make_server(app: WsgiApp, host: str, port: int, threads: int = 4) -> Server:
    """A waitress :class:`Server` for ``app`` bound to ``host:port`` (port 0:
    any free port, see :attr:`Server.port`)."""
    return Server(app, host, port, threads)
