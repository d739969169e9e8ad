"""At size, every statement the hot path, the sweep, the run page and the deploy
check run is index-served on PostgreSQL: EXPLAIN by statement name, no Seq Scan
on the big tables.

The data is a year of runs generated in bulk SQL (:mod:`benchmarks.scale_data`:
99 % settled, the live ones waiting on held and lapsed leases, timers and lost
messages), ANALYZEd, so the planner chooses on real statistics with
``enable_seqscan`` left on. The short form (2·10^4 runs) runs by default; the
long form (10^6 runs, 10^7 step rows, minutes to generate) with
``PIKKU_LONG=1``. ``benchmarks/scale.py`` times the same statements at 10^4
and 10^6 runs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pikku_celery.sql.engines import make_engine
from pikku_celery.store import migrate
from pikku_celery.store.sql_for import store_for
from tests.helpers import LONG
from tests.scale_data import generate
from tests.scale_statements import (
    CHECKED,
    Sample,
    bind,
    explain,
    sample,
    whole_table_reads,
)
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

SHORT_RUNS = 20_000
SHORT_STEPS_PER_RUN = 5
LONG_RUNS = 1_000_000
NAMES = [c.name for c in CHECKED]


def _loaded(runs: int, steps_per_run: int, tag: str) -> Iterator[sa.Engine]:
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_{tag}") as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=1, max_overflow=0)
        generate(engine, runs, steps_per_run)
        yield engine
        engine.dispose()


@pytest.fixture(scope="module")
def short_engine() -> Iterator[sa.Engine]:
    yield from _loaded(SHORT_RUNS, SHORT_STEPS_PER_RUN, "size")


@pytest.fixture(scope="module")
def long_engine() -> Iterator[sa.Engine]:
    if not LONG:
        pytest.skip("the 10^6-run form runs with PIKKU_LONG=1 (minutes to generate)")
    yield from _loaded(LONG_RUNS, 10, "size_long")


@functools.cache
def _named(engine: sa.Engine) -> dict[str, sa.ClauseElement]:
    return store_for(engine).statements.named()


@functools.cache
def _sample(engine: sa.Engine) -> Sample:
    with engine.connect() as conn:
        return sample(conn)


def _plan(engine: sa.Engine, name: str) -> str:
    stmt = _named(engine)[name]
    params = bind(stmt, name, _sample(engine))
    with engine.connect() as conn:
        try:
            return explain(conn, stmt, params)
        finally:
            conn.rollback()


@pytest.mark.parametrize("name", NAMES)
def test_no_big_table_is_read_whole(short_engine: sa.Engine, name: str) -> None:
    plan = _plan(short_engine, name)
    assert whole_table_reads(plan) == [], plan


@pytest.mark.parametrize("name", NAMES)
def test_no_big_table_is_read_whole_at_a_million_runs(long_engine: sa.Engine, name: str) -> None:
    plan = _plan(long_engine, name)
    assert whole_table_reads(plan) == [], plan


def test_the_idle_sweep_reads_a_window_of_live_runs(short_engine: sa.Engine) -> None:
    """Idle candidates come from the live-run indexes, each probed through the
    live-step index: never the settled history."""
    plan = _plan(short_engine, "idle")
    assert "ix_pikku_run_live_updated" in plan and "ix_pikku_run_live_recheck" in plan, plan
    assert "ix_pikku_step_live_run" in plan, plan


def test_the_checked_statements_are_the_stores_own(short_engine: sa.Engine) -> None:
    named = _named(short_engine)
    assert set(NAMES) <= set(named)
    shapes = {n for n in named if n.startswith(("list_runs[", "count_runs_capped["))}
    assert shapes <= set(NAMES)  # every shape of the page's list and counts
