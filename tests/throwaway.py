"""Servers a test starts itself, for tests that restart, crash or flush one.

The machine's PostgreSQL and Redis are shared with other developers and other
sessions: no test may restart, stop or flush them. A test that needs to do so
starts a throwaway server here (own data directory, free loopback port) and the
context manager always stops it and removes its files.

PostgreSQL refuses to run as root, so when the suite runs as root ``initdb``
and ``pg_ctl`` run as the ``postgres`` OS user, on a directory it owns.
(pytest-postgresql's process fixture runs them as the current user, so it
cannot serve here.)

The throwaway PostgreSQL runs with ``fsync=off``: that loses data only when the
machine itself crashes, never on ``pg_ctl -m immediate``, because the WAL that a
commit wrote is in the kernel's cache either way. Everything else, notably
``synchronous_commit``, keeps PostgreSQL's defaults, so a crash loses exactly
the asynchronous commits it would lose on the real server.

Both servers listen on loopback unless told a ``host`` (an address of a network
namespace, say) and take a ``command_prefix`` their server process starts
under (``["ip", "netns", "exec", "ns"]``): the cross-host fault suite runs them
in namespaces of their own.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import redis
import sqlalchemy as sa

from tests.helpers import wait_until

STOP_MODES = ("smart", "fast", "immediate")
_PG_TIMEOUT = 60
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class ThrowawayServerError(RuntimeError):
    """A throwaway server could not be set up, started or stopped."""


def free_port() -> int:
    """A loopback port nobody listens on now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise ThrowawayServerError(f"{name} not found: install the PostgreSQL server binaries")
    return found


def _as_server_user() -> list[str]:
    """PostgreSQL will not run as root: as root, run its tools as ``postgres``."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _run(args: list[str], prefix: Sequence[str] = ()) -> None:
    done = subprocess.run(
        [*prefix, *_as_server_user(), *args],
        capture_output=True,
        text=True,
        timeout=_PG_TIMEOUT + 30,
        check=False,
        cwd="/",
    )
    if done.returncode != 0:
        raise ThrowawayServerError(
            f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip() or done.stdout}"
        )


class ThrowawayPostgres:
    """One PostgreSQL cluster of the test's own, on a free port of ``host``."""

    def __init__(
        self, root: Path, host: str = "127.0.0.1", command_prefix: Sequence[str] = ()
    ) -> None:
        self.root = root
        self.host = host
        self.command_prefix = list(command_prefix)
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the ``postgres`` database, as superuser ``postgres``."""
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/postgres"

    def init(self) -> None:
        """Create the cluster: trust on loopback (and on the networks ``host`` is
        on), sockets in its own directory."""
        _run(
            [
                _pg_bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# throwaway test server\n"
                f"listen_addresses = '{self.host}'\n"
                f"unix_socket_directories = '{self.root}'\n"
                "fsync = off\n"
                "log_min_messages = warning\n"
            )
        if self.host != "127.0.0.1":
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write("host all all samenet trust\n")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._pg_ctl("start", "-o", f"-p {self.port}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: a crash, recovered from the WAL at start)."""
        self._pg_ctl("stop", "-m", _mode(mode))

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast``: clean; ``immediate``: a crash) and start again on the same port."""
        self._pg_ctl("restart", "-m", _mode(mode), "-o", f"-p {self.port}")

    def running(self) -> bool:
        """Whether the postmaster is up (``pg_ctl status``)."""
        try:
            self._pg_ctl("status")
        except ThrowawayServerError:
            return False
        return True

    def database_url(self, name: str) -> str:
        """Create database ``name`` (dropped first if it exists); return its URL."""
        if not _NAME.match(name):
            raise ValueError(f"not a plain database name: {name!r}")
        admin = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                conn.exec_driver_sql(f"CREATE DATABASE {name}")
        finally:
            admin.dispose()
        return sa.engine.make_url(self.url).set(database=name).render_as_string(False)

    def _pg_ctl(self, action: str, *extra: str) -> None:
        _run(
            [
                _pg_bin("pg_ctl"),
                action,
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                str(_PG_TIMEOUT),
                *extra,
            ],
            self.command_prefix,
        )


def _mode(mode: str) -> str:
    if mode not in STOP_MODES:
        raise ValueError(f"mode must be one of {STOP_MODES}, not {mode!r}")
    return mode


def _owned_temp_dir(prefix: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    return root


@contextmanager
def throwaway_postgres(
    host: str = "127.0.0.1", command_prefix: Sequence[str] = ()
) -> Iterator[ThrowawayPostgres]:
    """A started throwaway PostgreSQL; always stopped and deleted afterwards."""
    root = _owned_temp_dir("pikku-pg-")
    server = ThrowawayPostgres(root, host, command_prefix)
    try:
        server.init()
        for attempt in range(3):  # the free port may be taken before the server binds it
            try:
                server.start()
                break
            except ThrowawayServerError:
                if attempt == 2:
                    raise ThrowawayServerError(
                        f"throwaway PostgreSQL did not start: {_tail(server.log)}"
                    ) from None
                server.port = free_port()
        yield server
    finally:
        if server.running():
            server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


class ThrowawayRedis:
    """One Redis server of the test's own: nothing saved, on a free port of ``host``."""

    def __init__(
        self, root: Path, host: str = "127.0.0.1", command_prefix: Sequence[str] = ()
    ) -> None:
        self.root = root
        self.host = host
        self.command_prefix = list(command_prefix)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The redis-py URL of database 0."""
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> None:
        """Start ``redis-server`` and wait until it answers."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise ThrowawayServerError("redis-server not found")
        args = [*self.command_prefix, binary, "--port", str(self.port), "--bind", self.host]
        args += ["--save", ""]
        if self.host != "127.0.0.1":  # no password: Redis would refuse other hosts
            args += ["--protected-mode", "no"]
        args += ["--appendonly", "no", "--daemonize", "no", "--dir", str(self.root)]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.root
        )
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=1)

        def answers() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise ThrowawayServerError(f"redis-server exited ({self.process.returncode})")
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        try:
            wait_until(answers, timeout=20, interval=0.05)
        finally:
            client.close()

    def stop(self) -> None:
        """Kill the server (nothing is saved, so nothing is lost that a test relies on)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None

    def restart(self) -> None:
        """Kill and start again on the same port: every key is lost."""
        self.stop()
        self.start()


@contextmanager
def throwaway_redis(
    host: str = "127.0.0.1", command_prefix: Sequence[str] = ()
) -> Iterator[ThrowawayRedis]:
    """A started throwaway Redis; always stopped and deleted afterwards."""
    root = Path(tempfile.mkdtemp(prefix="pikku-redis-"))
    server = ThrowawayRedis(root, host, command_prefix)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"
