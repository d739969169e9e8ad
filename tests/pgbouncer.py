"""PgBouncer in front of the shared PostgreSQL, for tests that go through a pooler.

Production PostgreSQL often sits behind PgBouncer in transaction pooling: each
transaction may run on another server connection, so session state
(protocol-level prepared statements on PgBouncer before 1.21, ``SET``,
``LISTEN``) does not follow the client. :func:`pgbouncer` starts Debian's
``pgbouncer`` on a free loopback port with a config of its own (trust auth,
``pool_mode`` as asked) in a temporary directory, and always stops it.

PgBouncer will not run as root: as root it runs as the ``postgres`` OS user,
on a directory that user owns. Its server connections carry the clients'
``application_name`` (PgBouncer sets it on the server connection), so the
session's connection cap (tests/pg_connection_cap.py) counts them; the pool
holds at most :data:`POOL_SIZE` of them per database.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.pooler import use_pooler
from tests.helpers import wait_until
from tests.services import PG_ADMIN_URL, unavailable
from tests.throwaway import ThrowawayServerError, free_port

POOL_SIZE = 5
"""Server connections PgBouncer keeps per database and user: few, as the shared
server's slots are few (the session's cap counts them, idle ones too, for
10 s), and enough for the suites' races: clients queue for them."""


def pgbouncer_binary() -> str:
    """Debian installs it in /usr/sbin, which a non-root PATH may lack."""
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )
    if found is None:
        raise ThrowawayServerError("pgbouncer not found: install Debian's pgbouncer package")
    return found


class PgBouncer:
    """One running PgBouncer: ``url(server_url)`` is a server URL rewritten to go through it."""

    def __init__(self, root: Path, server_host: str, server_port: int, pool_mode: str) -> None:
        self.root = root
        self.server_host = server_host
        self.server_port = server_port
        self.pool_mode = pool_mode
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log = root / "pgbouncer.log"

    def url(self, server_url: str | sa.URL) -> str:
        """``server_url`` (same user and database) through this PgBouncer."""
        u = sa.engine.make_url(server_url)
        return u.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def write_config(self, user: str) -> Path:
        (self.root / "userlist.txt").write_text(f'"{user}" ""\n')
        conf = self.root / "pgbouncer.ini"
        conf.write_text(
            "[databases]\n"
            f"* = host={self.server_host} port={self.server_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {POOL_SIZE}\n"
            "min_pool_size = 0\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 1000\n"
            "server_idle_timeout = 10\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log}\n"
            "log_connections = 0\n"
            "log_disconnections = 0\n"
        )
        return conf

    def start(self, user: str) -> None:
        """Start it in the foreground of a child process; wait until it accepts connections."""
        conf = self.write_config(user)
        args = [pgbouncer_binary(), str(conf)]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            for path in self.root.iterdir():
                shutil.chown(path, "postgres", "postgres")
            args[1:1] = ["-u", "postgres"]
        # Its log goes to the logfile too; stderr to a file, never a pipe
        # nobody reads (a full pipe would stall PgBouncer).
        with (self.root / "stderr.log").open("ab") as stderr:
            self.process = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=self.root
            )
        probe = sa.create_engine(
            f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/postgres",
            poolclass=sa.pool.NullPool,
            connect_args={"connect_timeout": 2, "prepare_threshold": None},
        )

        def answers() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise ThrowawayServerError(
                    f"pgbouncer exited ({self.process.returncode}): "
                    f"{_tail(self.root / 'stderr.log')} {_tail(self.log)}"
                )
            try:
                with probe.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
            except sa.exc.OperationalError:
                return False
            return True

        try:
            wait_until(answers, timeout=20, interval=0.05)
        finally:
            probe.dispose()

    def stop(self) -> None:
        """SIGINT: PgBouncer's immediate shutdown, its server connections closed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


@contextmanager
def pgbouncer(server_url: str, pool_mode: str = "transaction") -> Iterator[PgBouncer]:
    """A started PgBouncer in front of ``server_url``'s server; always stopped and deleted."""
    u = sa.engine.make_url(server_url)
    root = Path(tempfile.mkdtemp(prefix="pikku-pgbouncer-"))
    bouncer = PgBouncer(root, u.host or "127.0.0.1", u.port or 5432, pool_mode)
    try:
        for attempt in range(3):  # the free port may be taken before it binds it
            try:
                bouncer.start(u.username or "postgres")
                break
            except ThrowawayServerError:
                bouncer.stop()
                if attempt == 2:
                    raise
                bouncer.port = free_port()
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(root, ignore_errors=True)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no pgbouncer log)"


@pytest.fixture(scope="session")
def pgbouncer_server() -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling in front of the shared PostgreSQL, for the
    session (fails in CI, skips elsewhere, when it cannot start)."""
    with ExitStack() as stack:
        try:
            bouncer = stack.enter_context(pgbouncer(PG_ADMIN_URL, "transaction"))
        except (ThrowawayServerError, OSError) as exc:
            unavailable("pgbouncer", exc)
        yield bouncer


def pooled_engine(bouncer: PgBouncer, server_url: str | sa.URL, **kwargs: Any) -> sa.Engine:
    """An engine of ``server_url``'s database through ``bouncer``, set up for
    transaction pooling as ``Pikku(pooler="transaction")`` sets it up."""
    engine = make_engine(bouncer.url(server_url), **kwargs)
    use_pooler(engine, "transaction")
    return engine
