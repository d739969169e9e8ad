"""``store_for(engine)`` builds the store of the engine's database; a store built
as ``SQLWorkflowStore(engine)`` (user code from before ``store_for``) is the
portable store, on any database, and still works there."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from pikku_celery.store import SQLWorkflowStore, StepStatus, store_for
from pikku_celery.store.sql_mysql import MySQLWorkflowStore
from pikku_celery.store.sql_postgres import PostgresWorkflowStore
from tests.store.conftest import wipe
from tests.store.support import claim, make_tasks

NOWHERE = "nobody@127.0.0.1:1/none"  # nothing listens there: building connects to nothing
SERVERS = {"postgres": "store_pg_engine", "mariadb": "store_mysql_engine"}


@pytest.mark.parametrize(
    ("url", "chosen"),
    [
        (f"postgresql+psycopg://{NOWHERE}", PostgresWorkflowStore),
        (f"mysql+pymysql://{NOWHERE}", MySQLWorkflowStore),
        ("sqlite://", SQLWorkflowStore),
    ],
)
def test_store_for_builds_the_store_of_the_engines_database(url: str, chosen: type) -> None:
    engine = sa.create_engine(url)
    try:
        assert type(store_for(engine)) is chosen
        assert type(SQLWorkflowStore(engine)) is SQLWorkflowStore
    finally:
        engine.dispose()


@pytest.mark.parametrize("db", sorted(SERVERS))
def test_a_store_built_directly_runs_a_step_on_a_server(
    db: str, request: pytest.FixtureRequest
) -> None:
    engine: sa.Engine = request.getfixturevalue(SERVERS[db])
    wipe(engine)
    store = SQLWorkflowStore(engine)
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    store.complete_step(step.id, got.attempt, {"ok": True}, got.claim_id)
    done = store.get_step(step.id)
    assert done is not None and done.status == StepStatus.SUCCEEDED
    assert done.result == {"ok": True}
    assert [s.id for s in store_for(engine).get_steps(run.id)] == [step.id]
