"""The ``ScheduleStore`` conformance suite: memory, SQLite, PostgreSQL, MariaDB.

A schedule's row only moves forward: a beat that read an older tick never
sets it back, a skipped tick keeps the run of the tick before, and beats
racing to write the first row (or the same tick) all succeed or step aside
without an error.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery.errors import SchemaMissingError
from pikku_celery.schedule import InMemoryScheduleStore, ScheduleState, ScheduleStore
from pikku_celery.schedule.sql import SQLScheduleStore
from pikku_celery.sql.schema import schedule_table
from pikku_celery.store import migrate
from tests.store.conftest import BACKENDS

RUN_A = "0b5a4d8e-0000-4000-8000-00000000000a"
RUN_B = "0b5a4d8e-0000-4000-8000-00000000000b"


@pytest.fixture(params=BACKENDS)
def schedules(request: pytest.FixtureRequest) -> ScheduleStore:
    backend = str(request.param)
    if backend == "memory":
        return InMemoryScheduleStore()
    if backend == "sqlite":
        engine: sa.Engine = request.getfixturevalue("sqlite_engine")
        migrate.upgrade(engine)
    else:
        fixture = "store_pg_engine" if backend == "postgres" else "store_mysql_engine"
        engine = request.getfixturevalue(fixture)
    with engine.begin() as conn:
        conn.execute(schedule_table.delete())
    return SQLScheduleStore(engine)


def state(tick: int, run_id: str | None, name: str = "nightly") -> ScheduleState:
    return ScheduleState(name, "report", "every 5s", tick, tick + 5000, run_id, 0)


def test_the_first_row_then_only_newer_ticks(schedules: ScheduleStore) -> None:
    assert schedules.schedule_states() == {}
    assert schedules.note_tick(state(10_000, None))
    assert schedules.note_tick(state(15_000, RUN_A))
    assert not schedules.note_tick(state(10_000, RUN_B))  # an older tick: refused
    row = schedules.schedule_states()["nightly"]
    assert (row.last_tick_ms, row.next_tick_ms, row.last_run_id) == (15_000, 20_000, RUN_A)
    assert (row.workflow, row.spec) == ("report", "every 5s")
    assert abs(row.updated_at_ms - schedules.now_ms()) < 60_000  # the store's clock


def test_a_skipped_tick_keeps_the_run_and_the_same_tick_may_name_its_run(
    schedules: ScheduleStore,
) -> None:
    schedules.note_tick(state(5_000, RUN_A))
    assert schedules.note_tick(state(10_000, None))  # skipped: RUN_A still runs
    assert schedules.schedule_states()["nightly"].last_run_id == RUN_A
    assert not schedules.note_tick(state(10_000, None))  # the same skip again: nothing
    assert schedules.note_tick(state(10_000, RUN_B))  # another beat started it after all
    row = schedules.schedule_states()["nightly"]
    assert (row.last_tick_ms, row.last_run_id) == (10_000, RUN_B)


def test_schedules_are_kept_apart(schedules: ScheduleStore) -> None:
    schedules.note_tick(state(5_000, RUN_A, "a"))
    schedules.note_tick(state(9_000, RUN_B, "b"))
    rows = schedules.schedule_states()
    assert {n: r.last_tick_ms for n, r in rows.items()} == {"a": 5_000, "b": 9_000}


def test_beats_racing_on_the_first_row_and_the_next_ticks(schedules: ScheduleStore) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def beat(offset: int) -> None:
        try:
            barrier.wait()
            for tick in range(1, 6):
                schedules.note_tick(state(tick * 5_000, RUN_A if offset % 2 else None))
        except BaseException as exc:  # pragma: no cover - shown by the assert
            errors.append(exc)

    threads = [threading.Thread(target=beat, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert schedules.schedule_states()["nightly"].last_tick_ms == 25_000


def test_a_database_without_the_schedule_table_names_the_command(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrate.upgrade(engine, "0007")  # upgraded before schedules existed
    schedules = SQLScheduleStore(engine)
    with pytest.raises(SchemaMissingError, match=r"pikku_schedule is missing.*db upgrade"):
        schedules.schedule_states()
    migrate.upgrade(engine)
    assert SQLScheduleStore(engine).schedule_states() == {}
    engine.dispose()
