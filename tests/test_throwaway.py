"""The throwaway servers that restart and crash tests use instead of the shared ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from tests.throwaway import ThrowawayPostgres, ThrowawayRedis, throwaway_postgres


def _start_time(url: str) -> object:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT pg_postmaster_start_time()")).scalar_one()
    finally:
        engine.dispose()


def test_a_crash_keeps_every_synchronous_commit(throwaway_pg: ThrowawayPostgres) -> None:
    url = throwaway_pg.database_url("crash_keeps")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (n int)"))
        conn.execute(sa.text("INSERT INTO t SELECT generate_series(1, 1000)"))
    before = _start_time(url)

    throwaway_pg.restart("immediate")

    assert _start_time(url) != before, "the server did not restart"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar_one() == 1000
        setting = conn.execute(sa.text("SHOW synchronous_commit")).scalar_one()
    assert setting == "on"
    engine.dispose()


def test_stop_refuses_connections_until_start(throwaway_pg: ThrowawayPostgres) -> None:
    throwaway_pg.stop("fast")
    assert not throwaway_pg.running()
    with pytest.raises(sa.exc.OperationalError):
        _start_time(throwaway_pg.url)
    throwaway_pg.start()
    assert _start_time(throwaway_pg.url) is not None


def test_the_server_and_its_files_are_gone_afterwards() -> None:
    with throwaway_postgres() as server:
        root = server.root
        url = server.url
        assert _start_time(url) is not None
    assert not Path(root).exists()
    with pytest.raises(sa.exc.OperationalError):
        _start_time(url)


def test_a_bad_stop_mode_is_refused(throwaway_pg: ThrowawayPostgres) -> None:
    with pytest.raises(ValueError, match="immediate"):
        throwaway_pg.restart("abrupt")


def test_a_restarted_redis_has_lost_its_keys(throwaway_redis_server: ThrowawayRedis) -> None:
    client = redis.Redis.from_url(throwaway_redis_server.url)
    client.set("k", "v")
    throwaway_redis_server.restart()
    assert client.get("k") is None
    client.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does the server run as postgres")
def test_as_root_the_server_runs_as_postgres(throwaway_pg: ThrowawayPostgres) -> None:
    assert throwaway_pg.data.owner() == "postgres"
