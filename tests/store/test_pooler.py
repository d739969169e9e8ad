"""PostgreSQL behind PgBouncer: the ``pooler`` setting and the warning without it.

Behind transaction pooling, psycopg must prepare nothing and ``wait()`` must
not LISTEN (:mod:`pikku_celery.sql.pooler`). A store that goes through a
pooler no setting names says so once, at first use; a direct connection or
a named pooler says nothing.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from pikku_celery import Pikku, PoolerWarning
from pikku_celery.engine.passes import take_pass
from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.pooler import pooler_seen, prepares_nothing
from pikku_celery.store import Decision, NewRun, RunStatus
from pikku_celery.store.sql_for import store_for
from tests.helpers import wait_until
from tests.pgbouncer import PgBouncer, pgbouncer
from tests.services import PG_ADMIN_URL, unavailable
from tests.store.conftest import wipe
from tests.throwaway import ThrowawayServerError


@pytest.fixture
def through_bouncer(store_pg_engine: sa.Engine, pgbouncer_server: PgBouncer) -> Iterator[sa.Engine]:
    """A plain engine (no pooler setting) of the store's database through PgBouncer."""
    wipe(store_pg_engine)
    engine = make_engine(pgbouncer_server.url(store_pg_engine.url), pool_size=1)
    yield engine
    engine.dispose()


def test_a_store_behind_pgbouncer_without_the_setting_warns_at_first_use(
    through_bouncer: sa.Engine,
) -> None:
    store = store_for(through_bouncer)  # builds without connecting
    with pytest.warns(PoolerWarning, match="pooler='transaction'"):
        store.prepare()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolerWarning)
        store.create_run(NewRun(workflow="wf", input=None))  # once: not per call


def test_pooler_transaction_silences_it_prepares_nothing_and_does_not_listen(
    through_bouncer: sa.Engine,
) -> None:
    store = store_for(through_bouncer, pooler="transaction")
    assert prepares_nothing(through_bouncer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolerWarning)
        run, _ = store.create_run(NewRun(workflow="wf", input=None))
    with through_bouncer.connect() as conn:
        assert conn.connection.driver_connection.prepare_threshold is None
    with store.settled_listener(run.id) as watch:
        assert watch is None  # wait() polls


def test_a_direct_connection_is_not_taken_for_a_pooler(
    store_pg_engine: sa.Engine, through_bouncer: sa.Engine
) -> None:
    assert pooler_seen(store_pg_engine) is None
    assert pooler_seen(through_bouncer) is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", PoolerWarning)
        store_for(store_pg_engine).prepare()
        store_for(through_bouncer, pooler="session").prepare()


def test_a_pooler_setting_is_checked(sqlite_url: str) -> None:
    app = Celery("pooler-check", broker="memory://", set_as_current=False)
    with pytest.raises(ValueError, match="pooler must be one of"):
        Pikku(app, sqlite_url, pooler="statement")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is for PostgreSQL"):
        Pikku(app, sqlite_url, pooler="transaction")


SESSION_STATE = re.compile(
    r"^\s*(SET|RESET|LISTEN|PREPARE|DECLARE)\b|set_config\([^)]*,\s*false\)|pg_advisory_lock\(",
    re.IGNORECASE | re.MULTILINE,
)


def test_no_named_statement_keeps_session_state(store_pg_engine: sa.Engine) -> None:
    """Behind transaction pooling a session setting would stay on a server
    connection another client gets next: every PostgreSQL statement the store
    and the lease service run keeps its settings local to its transaction."""
    from pikku_celery.lease import SQLLeaseService

    store = store_for(store_pg_engine)
    dialect = store_pg_engine.dialect
    statements: dict[str, Any] = dict(store.statements.named())
    leases = SQLLeaseService(store_pg_engine)
    statements.update({f"lease:{k}": v for k, v in leases.named_statements().items()})
    compiled = {name: str(stmt.compile(dialect=dialect)) for name, stmt in statements.items()}
    assert any("set_config" in sql for sql in compiled.values())  # the local ones are seen
    offending = {name: sql for name, sql in compiled.items() if SESSION_STATE.search(sql)}
    assert offending == {}


@pytest.fixture(scope="module")
def session_bouncer() -> Iterator[PgBouncer]:
    """A PgBouncer of the module's own, in session pooling."""
    with ExitStack() as stack:
        try:
            bouncer = stack.enter_context(pgbouncer(PG_ADMIN_URL, "session"))
        except (ThrowawayServerError, OSError) as exc:
            unavailable("pgbouncer", exc)
        yield bouncer


def test_behind_session_pooling_wait_is_woken_by_the_settle_notice(
    store_pg_engine: sa.Engine, session_bouncer: PgBouncer
) -> None:
    """Session pooling keeps a client's server connection: LISTEN works, and
    ``pooler="session"`` keeps it."""
    wipe(store_pg_engine)
    engine = make_engine(session_bouncer.url(store_pg_engine.url), pool_size=2)
    store = store_for(engine, pooler="session")
    try:
        run, _ = store.create_run(NewRun(workflow="wf", input=None))
        with store.settled_listener(run.id) as watch:
            assert watch is not None
            take_pass(
                store, run.id, None, lambda _: Decision(run_status=RunStatus.COMPLETED, output=5)
            )
            wait_until(lambda: watch.settled() is not None, timeout=10)
            settled = watch.settled()
        assert settled is not None and (settled.status, settled.output) == (RunStatus.COMPLETED, 5)
    finally:
        store.close()
        engine.dispose()
