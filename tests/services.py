"""Per-session test databases on the machine's real services.

Each pytest session makes its own PostgreSQL and MariaDB databases and its own
Redis key prefix, and drops them afterwards. In CI (``CI=true``) a service
that cannot be reached fails the test; elsewhere it skips it.

These servers are shared with other developers: nothing here restarts, stops
or flushes them. A test that must do so starts its own (:mod:`tests.throwaway`).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis
import sqlalchemy as sa

from tests.helpers import wait_until

SESSION_TAG = f"pikku_t{uuid.uuid4().hex[:10]}"

# Every PostgreSQL connection of the session (worker subprocesses inherit the
# environment) names the session, so it can be counted and told apart from
# other developers' (tests/pg_connection_cap.py). A pytest run started inside
# a test keeps its parent's name: its connections are the parent's too.
# A pytest-xdist worker is a session of its own under the run's name: its tag
# and application_name are the run's with the worker's id added, so the run
# counts every worker's connections and databases by its name, and a worker
# that counts its own connections does not see its sibling's.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_RUN_NAME = os.environ.get("PGAPPNAME", "")
if not _RUN_NAME.startswith("pikku_t"):
    os.environ["PGAPPNAME"] = SESSION_TAG
elif _XDIST_WORKER and not _RUN_NAME.endswith(f"_{_XDIST_WORKER}"):
    SESSION_TAG = os.environ["PGAPPNAME"] = f"{_RUN_NAME}_{_XDIST_WORKER}"
SUITE_APP_NAME = os.environ["PGAPPNAME"]

PG_ADMIN_URL = os.environ.get(
    "PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_ADMIN_URL = os.environ.get("PIKKU_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
REDIS_URL = os.environ.get("PIKKU_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("PIKKU_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def unavailable(service: str, exc: BaseException) -> None:
    """Fail in CI, skip elsewhere: CI must never pass by skipping a service."""
    msg = f"{service} is not reachable: {exc}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def reachable_redis(db: int | None = None) -> tuple[str, redis.Redis]:
    """The shared Redis's URL (on database ``db``, else the suite's) and a
    client that answered a ping; skip (fail in CI) when it does not."""
    url = REDIS_URL if db is None else REDIS_URL.rsplit("/", 1)[0] + f"/{db}"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except Exception as exc:
        client.close()
        unavailable("redis", exc)
    return url, client


@contextmanager
def scratch_database(admin_url: str, name: str) -> Iterator[str]:
    """Create database ``name`` on the server of ``admin_url``; drop it after."""
    # No pool: one short connection to create the database, one to drop it.
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    url = sa.engine.make_url(admin_url).set(database=name)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except Exception as exc:
        admin.dispose()
        unavailable(url.get_backend_name(), exc)
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        try:
            with admin.connect() as conn:
                if url.get_backend_name() == "postgresql":
                    conn.exec_driver_sql(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                    )
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        finally:
            admin.dispose()


def terminate_backend(engine: sa.Engine, pid: int) -> None:
    """Kill one PostgreSQL backend (as a failover or an admin would) and wait
    until the server has let it go.

    Only one of this session's own (its application_name starts with the
    session's): on the shared server, never another developer's connection."""
    kill = sa.text(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE pid = :pid AND left(application_name, length(:app)) = :app"
    )
    with engine.connect() as admin:
        killed = admin.execute(kill, {"pid": pid, "app": SUITE_APP_NAME}).scalar()
        admin.commit()
    if not killed:
        raise AssertionError(f"backend {pid} is not one of this session's ({SUITE_APP_NAME})")

    def gone() -> bool:
        with engine.connect() as admin:
            row = admin.execute(
                sa.text("SELECT 1 FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).first()
        return row is None

    wait_until(gone, timeout=10)
