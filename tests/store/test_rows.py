"""Steps read in bulk (``steps_from``) are the steps read one by one (``step_from``)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from pikku_celery.payload import UnreadableValue
from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.schema import step_table
from pikku_celery.store.rows import step_from, steps_from
from pikku_celery.store.sql_for import store_for
from tests.store.support import make_run, task


def test_steps_read_in_bulk_are_the_steps_read_one_by_one(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/rows.db")
    store = store_for(engine)
    run, _ = make_run(
        store, task("a", 0, max_attempts=3, args=[1, "x"], kwargs={"k": None}), task("b", 1)
    )
    with engine.begin() as conn:  # an operator's edit: a result that is not JSON
        conn.execute(step_table.update().where(step_table.c.name == "b").values(result="{bad"))
        rows = conn.execute(sa.select(step_table).order_by(step_table.c.seq)).all()
    bulk = steps_from(rows)
    assert bulk == [step_from(row) for row in rows]
    assert [s.name for s in bulk] == ["a", "b"] and bulk[0].run_id == run.id
    assert isinstance(bulk[1].result, UnreadableValue) and "column result" in bulk[1].result.where
    engine.dispose()
