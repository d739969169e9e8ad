"""The schedule store's round trips, by statement name, on a recording connector.

The races themselves run on real databases (``tests/store/test_schedule_store.py``);
these pin what each call sends: a tick that moves a row forward is one
transaction, a first tick inserts, and the loser of a race to insert moves
the winner's row forward instead.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from pikku_celery.schedule import sql as sched
from pikku_celery.schedule.model import ScheduleState
from pikku_celery.schedule.sql import SQLScheduleStore
from pikku_celery.sql.dialect import create
from pikku_celery.sql.recording import RecordingConnector
from pikku_celery.sql.schema import schedule_table

TICK = ScheduleState("nightly", "wf", "0 3 * * *", 1_000, 2_000, None, 0)


@pytest.fixture
def recorded(sqlite_engine: sa.Engine) -> tuple[SQLScheduleStore, RecordingConnector]:
    schedule_table.create(sqlite_engine)  # the schema check reads the real database
    rec = RecordingConnector(create(sqlite_engine))
    return SQLScheduleStore(sqlite_engine, connector=rec), rec


def test_a_tick_that_moves_a_row_forward_is_one_transaction(
    recorded: tuple[SQLScheduleStore, RecordingConnector],
) -> None:
    store, rec = recorded
    rec.answers[sched.ADVANCE] = [()]  # one row matched
    assert store.note_tick(TICK)
    assert [(c.name, c.transaction) for c in rec.calls] == [(sched.ADVANCE, 1)]
    assert rec.calls[0].params["last_tick"] == 1_000


def test_a_tick_with_a_run_names_it_and_an_old_tick_is_refused(
    recorded: tuple[SQLScheduleStore, RecordingConnector],
) -> None:
    store, rec = recorded
    rec.answers[sched.EXISTS] = [("nightly",)]  # the row is there, but newer
    started = ScheduleState("nightly", "wf", "0 3 * * *", 1_000, 2_000, "run-1", 0)
    assert not store.note_tick(started)
    assert rec.names() == [sched.NAME_RUN, sched.EXISTS]
    assert rec.calls[0].params["last_run_id"] == "run-1"


def test_the_first_tick_inserts_and_the_loser_of_that_race_moves_forward(
    recorded: tuple[SQLScheduleStore, RecordingConnector],
) -> None:
    store, rec = recorded
    assert store.note_tick(TICK)
    assert [(c.name, c.transaction) for c in rec.calls] == [
        (sched.ADVANCE, 1),
        (sched.EXISTS, 1),
        (sched.INSERT, 0),
    ]
    del rec.calls[:]
    rec.fail[sched.INSERT] = sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
    # The winner's row is there once the insert lost: the second update matches it.
    rec.answers[sched.ADVANCE] = lambda _: [()] if rec.names().count(sched.ADVANCE) == 2 else []
    assert store.note_tick(TICK)
    assert rec.names() == [sched.ADVANCE, sched.EXISTS, sched.INSERT, sched.ADVANCE]
