"""Values a run takes are bounded in depth and size, and a stored value that
cannot be decoded fails its run (or lets it be cancelled) instead of wedging it.

A value nested deeper than the JSON decoder's recursion allowance stores fine
and then fails every later read with ``RecursionError``: a signal like that used
to leave its run ``running`` for good, with no error and no way to cancel it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import Context, RunStatus, StepFailedError
from pikku_celery.errors import PayloadError, SignalAlreadySentError
from pikku_celery.sql.schema import signal_table
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.testing import make_engine

from .conftest import Harness, _sql_store, make_harness


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def test_a_signal_nested_past_the_limit_is_refused_and_the_run_goes_on(h: Harness) -> None:
    @h.workflow
    def approval(ctx: Context) -> Any:
        return ctx.wait_for_signal("approve")

    run = approval.start()
    h.run()
    with pytest.raises(PayloadError, match=r"more than 100 deep.*max_payload_depth"):
        h.engine.send_signal(run.run_id, "approve", nested(950))
    with pytest.raises(PayloadError, match="max_payload_depth"):
        h.engine.send_signal(run.run_id, "approve", nested(100_000))  # too deep to encode
    h.engine.send_signal(run.run_id, "approve", nested(100))  # at the limit: taken
    h.run()
    assert run.wait(timeout=5) == nested(100)


def test_the_depth_limit_applies_to_inputs_arguments_results_and_outputs(
    store: Any,
) -> None:
    h = make_harness(store, max_payload_depth=5)

    @h.task
    def deep_result() -> Any:
        return nested(6)

    @h.workflow
    def echo(ctx: Context, value: Any) -> Any:
        return value

    @h.workflow
    def deep_step(ctx: Context) -> Any:
        try:
            return ctx.step("deep", deep_result, retries=3)
        except StepFailedError as exc:
            return f"refused: {exc}"

    @h.workflow
    def deep_output(ctx: Context) -> Any:
        return nested(6)

    with pytest.raises(PayloadError, match=r"input nests .* more than 5 deep"):
        echo.start(nested(6))
    refused = deep_step.start()
    made_up = deep_output.start()
    h.run()
    message = refused.wait(timeout=5)
    assert "result nests lists and objects more than 5 deep" in message
    assert [a.attempt for a in refused.steps()[0].attempts] == [1]  # not retried
    assert made_up.status() == RunStatus.FAILED
    assert "output nests lists and objects more than 5 deep" in str(made_up.state().error)


def test_a_result_larger_than_max_result_bytes_fails_its_step_at_once(store: Any) -> None:
    h = make_harness(store, max_result_bytes=1000)

    @h.task
    def big() -> str:
        return "x" * 2000

    @h.workflow
    def wf(ctx: Context) -> str:
        try:
            return str(ctx.step("big", big, retries=3))
        except StepFailedError as exc:
            return str(exc)

    run = wf.start()
    h.run()
    message = run.wait(timeout=5)
    assert "result is 2002 bytes of JSON, above the limit of 1000 (max_result_bytes)" in message
    assert [a.attempt for a in run.steps()[0].attempts] == [1]


def test_a_signal_name_is_delivered_once_and_a_different_resend_is_refused(h: Harness) -> None:
    @h.workflow
    def approval(ctx: Context) -> Any:
        return ctx.wait_for_signal("approve")

    run = approval.start()
    h.engine.send_signal(run.run_id, "approve", {"by": "ann", "n": 1})
    h.engine.send_signal(run.run_id, "approve", {"n": 1, "by": "ann"})  # a client's retry
    with pytest.raises(SignalAlreadySentError, match="already has signal 'approve'"):
        h.engine.send_signal(run.run_id, "approve", {"by": "bob"})
    h.run()
    assert run.wait(timeout=5) == {"by": "ann", "n": 1}


def test_max_payload_depth_is_checked_when_the_engine_is_made() -> None:
    for bad in (0, 501, "10"):
        with pytest.raises(ValueError, match="max_payload_depth must be an int from 1 to 500"):
            make_engine(max_payload_depth=bad)
    with pytest.raises(ValueError, match="max_result_bytes must be an int >= 1"):
        make_engine(max_result_bytes=0)


# --- a stored value that no reader can decode (an edited row, an older version's write)


@pytest.fixture(params=["sqlite", "postgres"])
def sql(request: pytest.FixtureRequest) -> Iterator[tuple[Harness, sa.Engine]]:
    engine: sa.Engine = request.getfixturevalue(f"{request.param}_engine")
    store = _sql_store(engine)
    assert isinstance(store, SQLWorkflowStore)
    yield make_harness(store), engine
    store.close()


def plant_signal(engine: sa.Engine, run_id: str, name: str, text: str) -> None:
    """Store a signal as an older release (or an operator) could have: unchecked."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(signal_table).values(run_id=run_id, name=name, payload=text, created_at=0)
        )


def test_a_stored_signal_too_deep_to_decode_fails_its_run_with_the_reason(
    sql: tuple[Harness, sa.Engine],
) -> None:
    h, engine = sql

    @h.workflow
    def approval(ctx: Context) -> Any:
        return ctx.wait_for_signal("approve")

    run = approval.start()
    h.run()
    plant_signal(engine, run.run_id, "approve", "[" * 5000 + "]" * 5000)
    h.engine.dispatcher.wake_run(run.run_id, reason="signal")
    h.run()
    assert run.status() == RunStatus.FAILED
    error = run.state().error
    assert error is not None and "signal 'approve' payload holds invalid JSON" in str(error)


def test_cancel_ends_a_run_whatever_its_stored_values_hold(
    sql: tuple[Harness, sa.Engine],
) -> None:
    h, engine = sql

    @h.workflow
    def approval(ctx: Context) -> Any:
        ctx.wait_for_signal("first")
        return ctx.wait_for_signal("second")

    run = approval.start()
    h.run()
    plant_signal(engine, run.run_id, "second", "[" * 5000 + "]" * 5000)
    h.engine.cancel(run.run_id)
    h.run()
    assert run.status() == RunStatus.CANCELLED
