"""The sweep's backlog benchmark in short (``benchmarks/sweep_backlog.py``, through
:mod:`tests.sweep_backlog`).

A thousand stalled runs (half lapsed leases, half lost messages), nothing ever
claimed: with a budget of ``PAGE * PAGES`` steps per query per sweep, every
run is re-sent within ``ceil(500 / budget)`` sweeps, each step once (what a
sweep re-sent waits out its backoff behind the rest, never in their way).
"""

from __future__ import annotations

import math

import pytest
import sqlalchemy as sa

from pikku_celery.store.sql_for import store_for
from tests.store.conftest import wipe
from tests.sweep_backlog import generate, sweep_until_all_reached

RUNS = 1000
PAGE, PAGES = 50, 2
ENGINES = {
    "sqlite": "sqlite_engine",
    "postgres": "store_pg_engine",
    "mariadb": "store_mysql_engine",
}


@pytest.mark.parametrize("db", sorted(ENGINES))
def test_a_thousand_stalled_runs_are_all_resent_within_the_bound(
    db: str, request: pytest.FixtureRequest
) -> None:
    engine: sa.Engine = request.getfixturevalue(ENGINES[db])
    store = store_for(engine)
    now = store.now_ms()  # on SQLite, its first use makes the tables
    wipe(engine)
    run_ids = generate(engine, RUNS, "mixed", now)
    bound = math.ceil((RUNS // 2) / (PAGE * PAGES))
    rows = sweep_until_all_reached(
        store,
        run_ids,
        max_sweeps=bound + 3,
        sweep_options={"limit": PAGE, "max_pages": PAGES},
        sweep_backoff=600.0,  # nothing re-sent comes back within the test
        sweep_max_backoff=600.0,
    )
    assert rows[-1].reached == RUNS
    assert len(rows) <= bound
    assert sum(r.resent for r in rows) == RUNS  # each step once: none re-sent while others wait
    assert [r.new_runs for r in rows] == [2 * PAGE * PAGES] * bound
