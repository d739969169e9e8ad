# mypy: disallow-untyped-decorators=False
"""A small app for the CLI tests, loaded with ``pikku-celery -A tests.cli.cliapp``.

The store is an SQLite file named by ``PIKKU_CLI_TEST_DB`` (each test sets
its own); the broker is kombu's in-memory transport, which nobody consumes:
tests run steps and passes by hand.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from pikku_celery import Concurrency, Context, Pikku

DB_PATH = os.environ["PIKKU_CLI_TEST_DB"]
FAILING: set[str] = {"cliapp.flaky"}  # tasks that raise; tests clear it to let them pass

app = Celery("cliapp", broker="memory://")
app.conf.update(
    task_default_queue="celery",
    task_routes={"cliapp.ship": {"queue": "shipping"}},
)
# outage_timeout: a command against an unreachable database rides out one
# second of outage, not the default ten, before its one-line error
pikku = Pikku(
    app,
    f"sqlite:///{DB_PATH}",
    queue_leases={"shipping": 45},
    message_grace=0.0,
    outage_timeout=1.0,
)


@app.task(name="cliapp.add", shared=False)
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="cliapp.ship", shared=False)
def ship(total: int) -> str:
    return f"parcel-{total}"


@app.task(name="cliapp.flaky", shared=False)
def flaky(value: Any) -> Any:
    if "cliapp.flaky" in FAILING:
        raise RuntimeError(f"flaky refused {value!r} [on purpose]")
    return value


@pikku.workflow(name="order")
def order(ctx: Context, data: dict[str, int]) -> dict[str, Any]:
    total = ctx.step("add", add, data["a"], data["b"])
    label = ctx.step("ship", ship, total)
    return {"total": total, "label": label}


@pikku.workflow(name="fragile")
def fragile(ctx: Context, value: Any) -> Any:
    return ctx.step("flaky", flaky, value)


@pikku.workflow(name="approval")
def approval(ctx: Context) -> Any:
    return ctx.wait_for_signal("approve")


@pikku.workflow(name="one_per_customer", concurrency=Concurrency(key=lambda data: data["customer"]))
def one_per_customer(ctx: Context, data: dict[str, Any]) -> Any:
    return ctx.step("add", add, data["a"], 1)


@pikku.workflow(name="broken")
def broken(ctx: Context, n: int) -> Any:
    """Fails in its body at once: many failed runs, cheaply (bulk retry)."""
    raise ValueError(f"broken run {n} [on purpose]")
