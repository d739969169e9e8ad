"""The sweep cannot be starved or slowed, on every store (issue 33, findings 3 and 4).

Each case runs the engine's own sweep over the store under test with an
inline dispatcher that only records what was sent: nothing is delivered, so
what the sweep re-sends stays lost, as when no worker consumes its queue.
"""

from __future__ import annotations

from collections import Counter

from pikku_celery.engine.core import WorkflowEngine
from pikku_celery.store import StepState, WorkflowStore
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.helpers import wait_until
from tests.store.support import LONG, SHORT, claim, lapse, make_run, make_tasks, task

WEDGED = 250  # more than one page of the sweep's queries (200)


def _engine(store: WorkflowStore, backoff: float) -> tuple[WorkflowEngine, InlineDispatcher]:
    return make_engine(
        store,
        InlineDispatcher(lease_ms=LONG),
        sweep_backoff=backoff,
        sweep_max_backoff=max(backoff, 600.0),
        message_grace=0.0,
        idle_after=3600.0,
    )


def _sent(dispatcher: InlineDispatcher) -> Counter[str]:
    return Counter(m.step_id for m in dispatcher.sent if m.kind == "step" and m.step_id)


def _lapsed_runs(store: WorkflowStore, n: int, task_name: str) -> list[StepState]:
    claimed = []
    for _ in range(n):
        _, steps = make_run(store, task("s", 0, task_name=task_name, max_attempts=3))
        claimed.append(claim(store, steps["s"], "gone", lease=SHORT))
    return claimed


def test_steps_the_sweep_cannot_get_taken_never_starve_an_ordinary_one(
    store: WorkflowStore,
) -> None:
    """Finding 3: lapsed steps of a task no worker has, re-sent and waiting out
    their backoff, filled the oldest-first batch; a newer lapsed step whose
    message was lost was never re-sent."""
    engine, dispatcher = _engine(store, backoff=600.0)
    wedged = _lapsed_runs(store, WEDGED, "tasks.nobody_has_it")
    (ordinary,) = _lapsed_runs(store, 1, "tasks.work")
    lapse(store, *wedged, ordinary)

    for _ in range(3):
        engine.sweep()
    sent = _sent(dispatcher)
    assert sent[ordinary.id] == 1
    # each wedged step re-sent once, then left alone for its backoff
    assert [sent[s.id] for s in wedged] == [1] * WEDGED


def test_every_lost_step_of_a_fan_out_is_resent_in_one_sweep(store: WorkflowStore) -> None:
    """Finding 4: the sweep re-sent one step of a run per sweep (per-run
    backoff), so a fan-out of lost messages recovered one step at a time."""
    engine, dispatcher = _engine(store, backoff=600.0)
    _, scheduled = make_tasks(store, 30)  # 30 parallel steps, their messages lost
    _, running = make_tasks(store, 30, max_attempts=3)  # 30 more, their worker lost
    lapse(store, *[claim(store, s, "gone", lease=SHORT) for s in running])
    wait_until(lambda: store.now_ms() > max(s.created_at for s in scheduled))

    report = engine.sweep()
    sent = _sent(dispatcher)
    assert [sent[s.id] for s in scheduled + running] == [1] * 60
    assert (report.resent, report.requeued_lapsed) == (30, 30)


def test_the_backoff_is_per_step(store: WorkflowStore) -> None:
    """A step re-sent waits out its own backoff; a step of the same run whose
    worker dies meanwhile is not held back by it."""
    engine, dispatcher = _engine(store, backoff=600.0)
    _, (first, second) = make_tasks(store, 2, max_attempts=3)
    got = claim(store, first, "gone", lease=SHORT)
    other = claim(store, second, "alive", lease=LONG)
    lapse(store, got)
    engine.sweep()
    engine.sweep()  # within the first step's backoff: not sent again
    assert _sent(dispatcher) == Counter({got.id: 1})

    assert store.refresh_step_lease(other.id, other.attempt, SHORT, other.claim_id)
    lapse(store, store.get_step(other.id))  # type: ignore[arg-type]
    engine.sweep()
    assert _sent(dispatcher) == Counter({got.id: 1, other.id: 1})


def test_a_step_is_resent_again_once_its_backoff_passes(store: WorkflowStore) -> None:
    engine, dispatcher = _engine(store, backoff=1.0)
    _, (step,) = make_tasks(store, 1, max_attempts=3)
    lapse(store, claim(store, step, "gone", lease=SHORT))
    engine.sweep()
    assert _sent(dispatcher)[step.id] == 1
    wait_until(lambda: (engine.sweep(), _sent(dispatcher)[step.id])[1] == 2, timeout=10)
