"""Which named statements the SQL lease service runs, per dialect, on a recording connector.

The conformance suite proves the rules on real databases; these pin the round
trips: one statement on its own where the database returns rows, an upsert
and a read back in one transaction where it cannot, and that transaction run
again whole when the database picks it as a deadlock victim.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pymysql
import pytest
import sqlalchemy as sa

from pikku_celery.lease import Lease, SQLLeaseService
from pikku_celery.lease import statements as st
from pikku_celery.sql.dialect import create
from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.recording import RecordingConnector

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def recorder(url: str) -> RecordingConnector:
    return RecordingConnector(create(sa.create_mock_engine(url, None)))


def row(holder: str = "A", token: int = 1, expires_at: int = 10_000, now: int = 5_000) -> object:
    return SimpleNamespace(holder=holder, token=token, expires_at=expires_at, now=now)


def test_with_returning_each_operation_is_one_statement_on_its_own() -> None:
    rec = recorder("postgresql+psycopg://")
    svc = SQLLeaseService(rec)
    rec.answers.update({st.ACQUIRE: [row()], st.REFRESH: [row(expires_at=20_000)]})
    lease = svc.acquire("k", "A", timedelta(seconds=3))
    assert lease is not None and lease.token == 1
    refreshed = svc.refresh(lease, 3.0)
    assert refreshed is not None and refreshed.expires_at > lease.expires_at
    svc.release(refreshed)
    assert svc.get("k") is None  # no row answered: nothing live
    assert [(c.name, c.transaction) for c in rec.calls] == [
        (st.ACQUIRE, 0),
        (st.REFRESH, 0),
        (st.RELEASE, 0),
        (st.GET, 0),
    ]
    assert rec.calls[0].params == {"lease_key": "k", "lease_holder": "A", "ttl_ms": 3000}
    assert rec.calls[2].params == {"lease_key": "k", "lease_holder": "A", "lease_token": 1}


def test_a_refused_acquire_returns_nothing() -> None:
    rec = recorder("sqlite://")
    svc = SQLLeaseService(rec)
    assert svc.acquire("k", "B", 3.0) is None  # the WHERE refused: no row
    rec.answers[st.ACQUIRE] = [row(holder="A")]  # MariaDB returns the row as it stands
    assert svc.acquire("k", "B", 3.0) is None


@pytest.mark.parametrize("url", ["mysql+pymysql://", "postgresql+psycopg://"])
def test_without_returning_the_row_is_read_back_in_the_same_transaction(url: str) -> None:
    rec = recorder(url)
    svc = SQLLeaseService(rec, use_returning=None if url.startswith("mysql") else False)
    rec.answers[st.READ_BACK] = [row(holder="A", expires_at=9_000, now=5_000)]
    lease = svc.acquire("k", "A", 3.0)
    assert lease is not None
    assert svc.refresh(lease, 3.0) is not None
    rec.answers[st.READ_BACK] = [row(holder="A", expires_at=5_000, now=5_000)]  # lapsed
    assert svc.refresh(lease, 3.0) is None
    assert [(c.name, c.transaction) for c in rec.calls] == [
        (st.ACQUIRE_UPSERT, 1),
        (st.READ_BACK, 1),
        (st.REFRESH_UPDATE, 2),
        (st.READ_BACK, 2),
        (st.REFRESH_UPDATE, 3),
        (st.READ_BACK, 3),
    ]


def test_a_deadlock_victim_runs_the_upsert_and_read_back_again() -> None:
    rec = recorder("mysql+pymysql://")
    svc = SQLLeaseService(rec)
    orig = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    rec.fail[st.READ_BACK] = sa.exc.OperationalError("SELECT ...", {}, orig)
    rec.answers[st.READ_BACK] = [row()]
    assert svc.acquire("k", "A", 3.0) == Lease("k", "A", 1, EPOCH + timedelta(milliseconds=10_000))
    assert rec.names() == [st.ACQUIRE_UPSERT, st.READ_BACK, st.ACQUIRE_UPSERT, st.READ_BACK]


@pytest.mark.parametrize("url", ["postgresql+psycopg://", "mysql+pymysql://", "sqlite://"])
def test_every_statement_is_named_on_every_dialect(url: str) -> None:
    rec = recorder(url)
    svc = SQLLeaseService(rec)
    every = {st.ACQUIRE, st.ACQUIRE_UPSERT, st.READ_BACK, st.REFRESH}
    every |= {st.REFRESH_UPDATE, st.RELEASE, st.GET}
    assert set(svc.named_statements()) == every
    svc.create_schema()
    assert rec.created == ["pikku_lease"]


@pytest.mark.parametrize("url_fixture", ["mysql_url", "sqlite_url"])
def test_a_service_made_before_its_first_connection_still_uses_returning(
    url_fixture: str, request: pytest.FixtureRequest
) -> None:
    """SQLAlchemy learns the server's RETURNING on the first connection."""
    engine = make_engine(request.getfixturevalue(url_fixture))
    sent: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: sent.append(a[2]))
    try:
        svc = SQLLeaseService(engine)  # no connection yet
        svc.create_schema()
        assert engine.dialect.insert_returning  # MariaDB >= 10.5, SQLite >= 3.35
        del sent[:]
        assert svc.acquire(f"k-{uuid.uuid4().hex}", "A", 5.0) is not None
        assert [s.split()[0] for s in sent if not s.startswith(("BEGIN", "COMMIT"))] == ["INSERT"]
    finally:
        engine.dispose()
