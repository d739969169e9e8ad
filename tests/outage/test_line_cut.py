"""A store that was reached, then went away: calls ride the outage out.

The database is reached through a TCP proxy whose line the test cuts (open
connections dropped, new ones refused), so the driver raises what it
raises when the server restarts, while the shared server runs on for
everyone else. An outage shorter than a call's time is not seen by the
caller; a longer one is :class:`StoreUnavailableError`, never the driver's
exception.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

from pikku_celery import Context, Pikku, RunStatus, StoreUnavailableError
from pikku_celery.engine import call_with
from pikku_celery.store import StepStatus
from pikku_celery.web.app import create_app
from tests.lease.tcp_proxy import TcpProxy

from .support import through

SHORT = 0.5
"""The outage timeout of the calls that are to give up."""
OUTAGE = 1.5
"""How long the line stays cut in the tests that ride it out."""


def echo(value: str) -> str:
    return value


def build(url: str, outage_timeout: float) -> Pikku:
    """A Pikku on ``url`` with one workflow of one step; no worker: steps
    are run by :func:`drive`."""
    app = Celery("cut", broker="memory://", set_as_current=False)
    pikku = Pikku(app, url, install_beat=False, outage_timeout=outage_timeout)
    app.task(name="cut.echo", shared=False)(echo)

    @pikku.workflow(name="cut.flow")
    def flow(ctx: Context, value: str) -> str:
        return str(ctx.step("echo", "cut.echo", value))

    return pikku


def drive(pikku: Pikku, run_id: str) -> None:
    """Run the run's scheduled step here, as a worker would."""
    for step in pikku.store.get_steps(run_id):
        if step.status == StepStatus.SCHEDULED:
            pikku.execute_step(run_id, step.id, step.task_name or "", call_with(echo))


@pytest.fixture
def pikkus(proxy: TcpProxy, outage_database: str) -> Iterator[tuple[Pikku, Pikku, Pikku]]:
    """Through the line: one that gives up soon, one that rides out longer;
    and one straight to the database (a worker the outage does not reach)."""
    made = (
        build(through(proxy, outage_database), SHORT),
        build(through(proxy, outage_database), OUTAGE * 6),
        build(outage_database, 1.0),
    )
    yield made
    for pikku in made:
        assert pikku.sql_engine is not None
        pikku.sql_engine.dispose()


@pytest.fixture
def no_run_failed(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.INFO, logger="pikku_celery")
    yield
    failing = [r.getMessage() for r in caplog.records if "failing the run" in r.getMessage()]
    assert failing == []


def calls(pikku: Pikku, run_id: str) -> dict[str, Callable[[], Any]]:
    """The public calls of a program, on a run that exists."""
    run = pikku.handle(run_id)
    return {
        "start": lambda: pikku.start("cut.flow", "x"),
        "start with an idempotency key": lambda: pikku.start("cut.flow", "x", idempotency_key="k1"),
        "status": run.status,
        "result": run.result,
        "wait": lambda: run.wait(timeout=SHORT),
        "steps": run.steps,
        "cancel": run.cancel,
        "send_signal": lambda: pikku.send_signal(run_id, "go", {"n": 1}),
        "retry": lambda: pikku.retry(run_id),
    }


CALL_NAMES = [
    "start",
    "start with an idempotency key",
    "status",
    "result",
    "wait",
    "steps",
    "cancel",
    "send_signal",
    "retry",
]


@pytest.mark.parametrize("name", CALL_NAMES)
def test_after_the_line_is_cut_a_call_raises_store_unavailable(
    pikkus: tuple[Pikku, Pikku, Pikku], proxy: TcpProxy, name: str, no_run_failed: None
) -> None:
    short, _, _ = pikkus
    run_id = short.start("cut.flow", "before").run_id  # the store was reached
    proxy.cut()
    with pytest.raises(StoreUnavailableError, match="unavailable"):
        calls(short, run_id)[name]()


def test_the_page_answers_503_after_the_line_is_cut(
    pikkus: tuple[Pikku, Pikku, Pikku], proxy: TcpProxy
) -> None:
    short, _, _ = pikkus
    run_id = short.start("cut.flow", "before").run_id
    client = create_app(short, lambda action, target: True).test_client()
    assert client.get(f"/api/runs/{run_id}").status_code == 200
    proxy.cut()
    for path in ("/api/runs", f"/api/runs/{run_id}", f"/runs/{run_id}"):
        answer = client.get(path)
        assert answer.status_code == 503 and answer.headers["Retry-After"], answer.data
        assert answer.json is not None and answer.json["error"] == "store_unavailable"


def restore_later(proxy: TcpProxy) -> threading.Timer:
    timer = threading.Timer(OUTAGE, proxy.restore)
    timer.start()
    return timer


def test_calls_ride_out_an_outage_shorter_than_their_time(
    pikkus: tuple[Pikku, Pikku, Pikku], proxy: TcpProxy, no_run_failed: None
) -> None:
    _, patient, direct = pikkus
    run_id = patient.start("cut.flow", "before").run_id
    proxy.cut()
    restore_later(proxy)
    assert patient.handle(run_id).status() == RunStatus.RUNNING
    proxy.cut()
    restore_later(proxy)
    assert patient.send_signal(run_id, "go", None).id == run_id
    proxy.cut()
    restore_later(proxy)
    started = patient.start("cut.flow", "during")  # stored once, after the outage
    drive(direct, started.run_id)
    assert direct.handle(started.run_id).result() == "during"
    with direct.sql_engine.connect() as conn:  # type: ignore[union-attr]
        count = conn.execute(
            sa.text("SELECT count(*) FROM pikku_workflow_run WHERE input = :i"), {"i": '"during"'}
        ).scalar_one()
    assert count == 1


def test_wait_across_an_outage_returns_the_output(
    pikkus: tuple[Pikku, Pikku, Pikku], proxy: TcpProxy
) -> None:
    """``wait()`` is cut off mid-wait; the run ends meanwhile (its worker still
    reaches the database); once the line is back, ``wait()`` returns its output."""
    _, patient, direct = pikkus
    run_id = patient.start("cut.flow", "across").run_id
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(patient.handle(run_id).wait(timeout=30)))
    waiter.start()
    proxy.cut()
    drive(direct, run_id)
    assert direct.handle(run_id).status() == RunStatus.COMPLETED
    restore_later(proxy)
    waiter.join(30)
    assert got == ["across"]


def test_a_start_that_cannot_store_its_run_fails_no_run(
    pikkus: tuple[Pikku, Pikku, Pikku], proxy: TcpProxy, no_run_failed: None
) -> None:
    short, _, direct = pikkus
    short.start("cut.flow", "warm")
    proxy.cut()
    with pytest.raises(StoreUnavailableError, match=r"starting workflow 'cut\.flow'"):
        short.start("cut.flow", "never")
    with direct.sql_engine.connect() as conn:  # type: ignore[union-attr]
        stored = conn.execute(
            sa.text("SELECT count(*) FROM pikku_workflow_run WHERE input = :i"), {"i": '"never"'}
        ).scalar_one()
    assert stored == 0
