"""Run the ``python`` snippets of README.md and the docs pages for real; print
what they did as JSON.

    python -m tests.readme_snippets SCENARIO SCRATCH_DIR

Run by ``tests/test_readme.py``, one process per scenario: the snippets make
a Celery app that becomes the current app, define shared ``@app.task``s that
every later app in the process would pick up, and (for Django) configure
settings once per process. None of that may leak into the test session.

The snippets live in README.md and in ``docs/**/*.md`` (the documentation
site); a snippet shown in both places must be the same text, so both are the
tested one. They run as written, in one namespace (each section
builds on the tutorial's ``app``, ``pikku`` and ``fulfil_order``), with only
these changes, each checked to still apply: the broker becomes ``memory://``
with an in-process Celery worker, the PostgreSQL URL an SQLite file, and the
tutorial's 30 s cooling-off sleep 0.1 s. Names a snippet uses without
defining (``ledger``, ``Order``, ``transaction``, a Flask ``app``,
``current_user``) are provided the way a project would have them.

The testing section's block is a test module: pytest runs it beside the
tutorial saved as ``shop.py``, with the broker and database URLs on closed
ports (the test environment touches neither) and the 30 s sleep as written
(the environment skips it).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# The README's blocks, told apart by a line each contains.
BLOCKS = {
    "tutorial": "pikku = Pikku(app, database_url=",
    "start": "run = fulfil_order.start(",
    "handles": "same = pikku.handle(",
    "transactional": "@transactional",
    "django_settings": "PIKKU_CELERY = {",
    "django_commit": "start_on_commit(",
    "flask": "PikkuFlask(",
    "run_page_flask": "run_page=True",
    "run_page_django": 'include("pikku_celery.contrib.django.urls")',
    "testing": "workflow_test_env(",
    "tracing": "tracing=True)",
    "patched": 'ctx.patched("gift-wrap")',
    "versions": '@pikku.workflow(name="refund", version="2")',
    "canvas": "pikku.durable(canvas",
    "pytest_celery": "celery_setup_pikku_installers",
    "leases": "step_lease=60.0,",
    "embedded_broker": 'broker="sqlite-queue:///broker.db"',
    "closing": "pikku.close()  # idempotent",
    "outage": "except StoreUnavailableError:",
    "pooler": 'pooler="transaction")',
    "events": 'ctx.set_event("progress", {"packed": 0',
    "concurrency": "concurrency=Concurrency(key=customer_of",
    "schedules": "@pikku.schedule(",
    "continue_as_new": "ctx.continue_as_new(",
}

Namespace = dict[str, Any]


def python_blocks(text: str) -> list[str]:
    """The bodies of the text's fenced ``python`` code blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def sources() -> list[Path]:
    """The README and every page of the documentation site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def all_blocks() -> list[tuple[str, str]]:
    """Every python block of :func:`sources`, with the file it is in."""
    return [
        (str(path.relative_to(ROOT)), block)
        for path in sources()
        for block in python_blocks(path.read_text())
    ]


def named_blocks(blocks: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Each python block under its name in :data:`BLOCKS`.

    A block no scenario runs is an error, and so are two copies of one
    snippet (the README's and a page's) that differ.
    """
    named: dict[str, str] = {}
    found_in: dict[str, str] = {}
    for where, block in all_blocks() if blocks is None else blocks:
        names = [name for name, marker in BLOCKS.items() if marker in block]
        if len(names) != 1:
            raise LookupError(
                f"{where}: a block matches {names or 'no known snippet'}; teach "
                f"tests/readme_snippets.py to run it:\n{block}"
            )
        name = names[0]
        if name in named and named[name] != block:
            raise LookupError(
                f"the {name!r} snippet differs between {found_in[name]} and {where}: "
                "keep the copies identical (one of them is tested)"
            )
        named[name], found_in[name] = block, found_in.get(name, where)
    return named


def substitute(block: str, replacements: dict[str, str]) -> str:
    """``block`` with each replacement made; one that no longer applies is an error."""
    for old, new in replacements.items():
        if old not in block:
            raise LookupError(f"the README snippet no longer contains {old!r}")
        block = block.replace(old, new)
    return block


def run_block(source: str, name: str, namespace: Namespace) -> None:
    """Execute one snippet in ``namespace``; tracebacks point at ``snippet:<name>``."""
    exec(compile(source, f"snippet:{name}", "exec"), namespace)


def tutorial(blocks: dict[str, str], scratch: Path) -> Namespace:
    """The five-minute tutorial's app, tasks and workflow, on memory:// and SQLite."""
    source = substitute(
        blocks["tutorial"],
        {
            '"redis://127.0.0.1:6379/0"': '"memory://"',
            '"postgresql+psycopg://127.0.0.1/shop"': f'"sqlite:///{scratch / "shop.db"}"',
            'ctx.sleep("cooling-off", 30)': 'ctx.sleep("cooling-off", 0.1)',
        },
    )
    namespace: Namespace = {"__name__": "readme"}
    run_block(source, "tutorial", namespace)
    app = namespace["app"]
    # The memory transport polls every second by default; the test has no time to lose.
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "polling_interval": 0.01,
    }
    return namespace


@contextmanager
def worker(namespace: Namespace) -> Iterator[None]:
    """Celery's in-process test worker on the tutorial's app, both of its queues."""
    from tests.helpers import in_process_worker

    with in_process_worker(
        namespace["app"],
        pool="solo",
        perform_ping_check=False,
        queues=("celery", "shipping"),
        loglevel="WARNING",
    ):
        yield


def run_report(handle: Any) -> dict[str, Any]:
    """A run's status, output and step names."""
    return {
        "run_id": handle.run_id,
        "status": str(handle.status()),
        "output": handle.state().output,
        "idempotency_key": handle.state().idempotency_key,
        "steps": [history.step.name for history in handle.steps()],
    }


# --- scenarios ----------------------------------------------------------------


def scenario_tutorial(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The tutorial, then starting a run and waiting for it, on a real worker."""
    namespace = tutorial(blocks, scratch)
    with worker(namespace):
        run_block(blocks["start"], "start", namespace)  # run.wait(timeout=60) inside
    run = namespace["run"]
    return {"run": run_report(run), "output": run.wait(timeout=5)}


def scenario_handles(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The Handles block on the tutorial's app: a handle from a stored id."""
    namespace = tutorial(blocks, scratch)
    printed = io.StringIO()
    with worker(namespace), contextlib.redirect_stdout(printed):
        run_block(blocks["handles"], "handles", namespace)
    same, started = namespace["same"], namespace["started"]
    return {
        "same_id": same.run_id == started.run_id,
        "run": run_report(same),
        "output": namespace["output"],
        "workflow": namespace["state"].workflow,
        "attempts": [len(h.attempts) for h in same.steps()],
        "printed": printed.getvalue().splitlines(),
    }


def scenario_transactional(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """``book_ledger`` as a step: its insert commits with the step's outcome."""
    import sqlalchemy as sa

    namespace = tutorial(blocks, scratch)
    pikku = namespace["pikku"]
    ledger = sa.Table(
        "ledger",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("order", sa.Integer, nullable=False),
        sa.Column("cents", sa.Integer, nullable=False),
    )
    ledger.create(pikku.sql_engine)
    namespace["ledger"] = ledger  # a table of the project's, in the store's database
    run_block(blocks["transactional"], "transactional", namespace)
    book_ledger = namespace["book_ledger"]

    def book_order(ctx: Any, order: dict[str, Any]) -> Any:
        return ctx.step("book", book_ledger, order["id"], order["cents"])

    book = pikku.workflow(name="readme.book")(book_order)

    with worker(namespace):
        handle = book.start({"id": 7, "cents": 1999})
        output = handle.wait(timeout=30)
    with pikku.sql_engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.select(ledger.c.order, ledger.c.cents))]
    return {"run": run_report(handle), "output": output, "ledger": rows}


def scenario_django(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The settings block as a project's settings; start_on_commit in a view's transaction."""
    namespace = tutorial(blocks, scratch)
    settings_ns: Namespace = {}
    run_block(blocks["django_settings"], "django_settings", settings_ns)

    # The project the settings name: proj/celery.py holding the Celery app.
    proj_dir = scratch / "proj"
    proj_dir.mkdir()
    (proj_dir / "__init__.py").write_text("")
    (proj_dir / "celery.py").write_text(
        'from celery import Celery\n\napp = Celery("proj", broker="memory://")\n'
    )
    sys.path.insert(0, str(scratch))

    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="readme",
        USE_TZ=True,
        INSTALLED_APPS=[app for app in settings_ns["INSTALLED_APPS"] if app is not Ellipsis],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(scratch / "django.db"),
            }
        },
        PIKKU_CELERY=settings_ns["PIKKU_CELERY"],
    )
    django.setup()
    from django.core import checks
    from django.db import transaction

    from pikku_celery.contrib.django import get_pikku

    project_pikku: Any = get_pikku()
    proj_celery = importlib.import_module("proj.celery")

    report: dict[str, Any] = {
        "checks": [str(message) for message in checks.run_checks()],
        "pikku_app_is_proj_celery_app": project_pikku.app is proj_celery.app,
        "pikku_database": str(project_pikku.sql_engine.url),
        "sweep_interval": project_pikku.sweep_interval,
    }

    class Order:
        """A stand-in for the project's model: ``objects.create(...)`` makes an order."""

        created: list[SimpleNamespace] = []

        class objects:
            """The model's manager."""

            @staticmethod
            def create(*args: Any, **kwargs: Any) -> SimpleNamespace:
                """A new order with the next id."""
                order = SimpleNamespace(id=41 + len(Order.created), cents=1999)
                Order.created.append(order)
                return order

    namespace.update(transaction=transaction, Order=Order)
    pikku = namespace["pikku"]

    class RolledBack(Exception):
        """Leaves the caller's transaction by rolling it back."""

    def runs() -> dict[str, str]:
        """The store's runs, by idempotency key."""
        return {str(r.idempotency_key): r.id for r in pikku.store.list_runs(limit=100)}

    # Inside a caller's transaction that rolls back: nothing starts.
    try:
        with transaction.atomic():
            run_block(blocks["django_commit"], "django_commit", namespace)
            raise RolledBack
    except RolledBack:
        pass
    report["rolled_back"] = {"order": Order.created[-1].id, "runs": sorted(runs())}
    # As written (its own atomic block commits): the run starts at the commit.
    with worker(namespace):
        run_block(blocks["django_commit"], "django_commit", namespace)
        order = Order.created[-1]
        report["committed"] = {"order": order.id, "runs": sorted(runs())}
        handle = pikku.handle(runs()[f"order-{order.id}"])
        try:
            report["output"] = handle.wait(timeout=30)
        except Exception as exc:
            report["output"] = f"{type(exc).__name__}: {exc}"
    report["run"] = run_report(handle)
    return report


def scenario_flask(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The Flask block on a Flask app; its endpoints answered through the test client."""
    from flask import Flask

    namespace = tutorial(blocks, scratch)
    user = SimpleNamespace(is_staff=True)
    flask_ns: Namespace = {**namespace, "app": Flask("readme"), "current_user": user}
    run_block(blocks["flask"], "flask", flask_ns)
    client = flask_ns["app"].test_client()
    name = namespace["fulfil_order"].name
    started = client.post(
        f"/api/workflows/{name}/runs",
        json={"input": {"id": 9, "cents": 500}, "idempotency_key": "order-9"},
    )
    run_id = started.get_json()["id"]
    status = client.get(f"/api/runs/{run_id}")
    user.is_staff = False
    refused = client.get(f"/api/runs/{run_id}")
    return {
        "extension": type(flask_ns["ext"]).__name__,
        "start": {"status_code": started.status_code, "json": started.get_json()},
        "status": {"status_code": status.status_code, "json": status.get_json()},
        "refused": {"status_code": refused.status_code, "json": refused.get_json()},
    }


def scenario_run_page_flask(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The run page's Flask block: its API answers, and the hook refuses a non-staff user."""
    from flask import Flask

    namespace = tutorial(blocks, scratch)
    user = SimpleNamespace(is_staff=True)
    flask_ns: Namespace = {**namespace, "app": Flask("readme"), "current_user": user}
    run_block(blocks["run_page_flask"], "run_page_flask", flask_ns)
    run = namespace["fulfil_order"].start({"id": 11, "cents": 300}, idempotency_key="order-11")
    client = flask_ns["app"].test_client()
    listed = client.get("/ops/pikku/api/runs")
    shown = client.get(f"/ops/pikku/api/runs/{run.run_id}")
    page = client.get("/ops/pikku/")
    user.is_staff = False
    refused = client.get("/ops/pikku/api/runs")
    return {
        "listed": {
            "status_code": listed.status_code,
            "ids": [r["id"] for r in listed.get_json()["runs"]],
        },
        "shown": {
            "status_code": shown.status_code,
            "workflow": shown.get_json()["run"]["workflow"],
        },
        "page": {"status_code": page.status_code, "html": "text/html" in page.content_type},
        "refused": refused.status_code,
        "run_id": run.run_id,
    }


def scenario_run_page_django(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The run page's Django block as a project's urls.py; a superuser reads the API."""
    namespace = tutorial(blocks, scratch)
    (scratch / "readme_urls.py").write_text(blocks["run_page_django"])
    sys.path.insert(0, str(scratch))

    import django
    from django.conf import settings

    settings.configure(
        SECRET_KEY="readme",
        USE_TZ=True,
        ROOT_URLCONF="readme_urls",
        ALLOWED_HOSTS=["testserver"],
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "pikku_celery.contrib.django",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(scratch / "dj.db")}
        },
        PIKKU_CELERY={"PIKKU": namespace["pikku"]},
    )
    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0, interactive=False)
    run = namespace["fulfil_order"].start({"id": 12, "cents": 300})
    client = Client()
    anonymous = client.get("/ops/pikku/api/runs")
    User.objects.create_superuser("admin", "a@example.com", "pw")
    client.force_login(User.objects.get(username="admin"))
    listed = client.get("/ops/pikku/api/runs")
    return {
        "anonymous": anonymous.status_code,
        "listed": {
            "status_code": listed.status_code,
            "ids": [r["id"] for r in listed.json()["runs"]],
        },
        "run_id": run.run_id,
    }


def scenario_tracing(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The tracing block on a Celery app of its own (its ``Pikku`` is the
    section's), spans kept in memory instead of printed; a two-step run on
    an in-process worker with Celery's instrumentation on."""
    from celery import Celery
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    app = Celery("readme_traced", broker="memory://", set_as_current=False)
    app.conf.broker_transport_options = {"polling_interval": 0.01}
    namespace: Namespace = {"__name__": "readme_tracing", "app": app, "README_SPANS": spans}
    source = substitute(
        blocks["tracing"],
        {
            "BatchSpanProcessor(ConsoleSpanExporter())": "SimpleSpanProcessor(README_SPANS)",
            "from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter": (
                "from opentelemetry.sdk.trace.export import SimpleSpanProcessor"
            ),
            '"postgresql+psycopg://127.0.0.1/shop"': f'"sqlite:///{scratch / "traced.db"}"',
        },
    )
    run_block(source, "tracing", namespace)
    pikku = namespace["pikku"]

    @app.task(name="readme.traced.echo", shared=False)
    def echo(n: int) -> int:
        return n

    @pikku.workflow(name="readme.traced")
    def traced(ctx: Any) -> list[Any]:
        return [ctx.step("one", echo, 1), ctx.step("two", echo, 2)]

    from tests.helpers import in_process_worker

    with in_process_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING"):
        run = traced.start()
        output = run.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the last attempt's span ends after its outcome
            if sum(s.name.startswith("pikku.attempt") for s in spans.get_finished_spans()) >= 2:
                break
            time.sleep(0.05)
    finished = spans.get_finished_spans()
    return {
        "output": output,
        "run_id": run.run_id,
        "spans": [
            {
                "name": s.name,
                "trace_id": f"{s.context.trace_id:032x}" if s.context else "",
                "span_id": f"{s.context.span_id:016x}" if s.context else "",
                "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
                "attributes": dict(s.attributes or {}),
            }
            for s in finished
        ],
    }


def scenario_versioning(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The two blocks of "Changing a workflow that has runs in flight" on a
    real worker: a patched body's run records its marker; a refund starts on
    the newest version; the deploy check passes them on this code."""
    from pikku_celery.engine.deploy_check import check_deploy

    namespace = tutorial(blocks, scratch)
    run_block(blocks["patched"], "patched", namespace)
    run_block(blocks["versions"], "versions", namespace)
    shipped, refund = namespace["ship_order"].start({"id": 3, "cents": 100}), namespace["refund"]
    check = check_deploy(namespace["pikku"])  # both in flight, on this very code
    with worker(namespace):
        outputs = [shipped.wait(timeout=30), refund.wait(timeout=30)]
    return {
        "ship_order": run_report(shipped),
        "refund": run_report(refund),
        "versions": [shipped.state().workflow_version, refund.state().workflow_version],
        "outputs": outputs,
        "check": {"checked": check.checked, "ok": check.ok},
    }


def scenario_canvas(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The durable canvas block on the tutorial's app and worker; what it printed."""
    namespace = tutorial(blocks, scratch)
    printed = io.StringIO()
    with worker(namespace), contextlib.redirect_stdout(printed):
        run_block(blocks["canvas"], "canvas", namespace)
    run = namespace["run"]
    again = namespace["pikku"].durable(namespace["canvas"], idempotency_key="totals-1")
    return {
        "printed": printed.getvalue().splitlines(),
        "run": run_report(run),
        "workflow": run.state().workflow,
        "same_run_again": again.run_id == run.run_id,
    }


def scenario_schedules(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The schedules block on the tutorial's app: both schedules defined, the
    beat entry installed; a tick five minutes ago (as if the last pass had
    seen the one before) starts its run, which completes on a worker."""
    from pikku_celery.schedule import ScheduleState

    namespace = tutorial(blocks, scratch)
    run_block(blocks["schedules"], "schedules", namespace)
    pikku = namespace["pikku"]
    prices = pikku.schedules["prices"]
    now = pikku.store.now_ms()
    tick = prices.spec.latest(now)
    before = ScheduleState("prices", "prices", "", tick - 300_000, tick, None, now)
    pikku.schedule_store.note_tick(before)
    started = pikku.run_schedules().started
    with worker(namespace):
        outputs = [pikku.handle(run_id).wait(timeout=30) for _, _, run_id in started]
    return {
        "schedules": sorted(pikku.schedules),
        "beat": namespace["app"].conf.beat_schedule["pikku-schedules"]["task"],
        "nightly": pikku.schedules["nightly-check"].overlap.value,
        "started": [(name, t == tick) for name, t, _ in started],
        "outputs": outputs,
    }


PLUGIN = "pikku_celery.testing.pytest_plugin"


def scenario_testing(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The testing section's test module, run by pytest on the tutorial's module.

    The tutorial is saved as ``shop.py`` with its broker and database on
    closed ports, so a message sent or a connection opened fails the tests;
    its 30 s sleep is left as written. ``pikku_app`` is set as the section's
    toml block sets it.
    """
    app_source = substitute(
        blocks["tutorial"],
        {
            '"redis://127.0.0.1:6379/0"': '"redis://127.0.0.1:1/0"',
            '"postgresql+psycopg://127.0.0.1/shop"': '"postgresql+psycopg://127.0.0.1:1/shop"',
        },
    )
    (scratch / "shop.py").write_text(app_source)
    (scratch / "test_shop.py").write_text(blocks["testing"])
    (scratch / "pytest.ini").write_text("[pytest]\npikku_app = shop:pikku\n")
    # The plugin loads through its entry point; -p keeps a stale install working too.
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "test_shop.py"],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=100,
    )
    return {
        "returncode": done.returncode,
        "output": (done.stdout + done.stderr)[-4000:],
        "seconds": round(time.monotonic() - started, 2),
    }


def scenario_pytest_celery(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The pytest-celery section's test module, run by pytest with pikku's plugin.

    As written, in a folder of its own with only ``-p
    pikku_celery.testing.pytest_celery``; the servers are the test suite's
    (``PIKKU_TEST_REDIS_URL``, ``PIKKU_TEST_AMQP_URL``).
    """
    from tests.services import AMQP_URL, REDIS_URL

    (scratch / "test_on_workers.py").write_text(blocks["pytest_celery"])
    (scratch / "pytest.ini").write_text(
        "[pytest]\naddopts = -p pikku_celery.testing.pytest_celery\n"
    )
    env = {
        **os.environ,
        "PIKKU_CELERY_TEST_REDIS_URL": REDIS_URL,
        "PIKKU_CELERY_TEST_AMQP_URL": AMQP_URL,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_on_workers.py"],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    return {"returncode": done.returncode, "output": (done.stdout + done.stderr)[-4000:]}


def scenario_leases(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The leases page's settings on the tutorial's app (its memory:// broker
    has no visibility timeout: the default horizon): each queue's lease."""
    namespace = tutorial(blocks, scratch)
    namespace["database_url"] = f"sqlite:///{scratch / 'leases.db'}"
    run_block(blocks["leases"], "leases", namespace)
    pikku = namespace["pikku"]
    leases = {q: pikku.lease_for_queue(q) for q in ("reports", "celery")}
    return {q: {"seconds": lease.seconds, "horizon": lease.horizon} for q, lease in leases.items()}


def scenario_embedded_broker(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The embedded broker page's app: a message sent through it comes back
    from the file it names (relative to the working directory)."""
    os.chdir(scratch)
    namespace: Namespace = {}
    run_block(blocks["embedded_broker"], "embedded_broker", namespace)
    app = namespace["app"]
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("snippet")
        queue.put({"hello": "broker"})
        message = queue.get(timeout=5)
        message.ack()
        queue.close()
    return {"body": message.payload, "file": (scratch / "broker.db").exists()}


def scenario_closing(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The closing page's block on the tutorial: a run, then close twice; the
    closed Pikku still starts and finishes a run (it reopens what it needs)."""
    namespace = tutorial(blocks, scratch)
    with worker(namespace):
        run_block(blocks["closing"], "closing", namespace)
        again = namespace["fulfil_order"].start({"id": 9, "cents": 700})
        after = again.wait(timeout=30)
    return {"done": namespace["done"], "after_close": after}


def scenario_outage(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The outages page's block with the database down (nothing listens on
    port 9): the start gives up with StoreUnavailableError, stores nothing."""
    from celery import Celery

    from pikku_celery import Pikku

    app = Celery("outage", broker="memory://", set_as_current=False)
    url = "postgresql+psycopg://127.0.0.1:9/shop"
    pikku = Pikku(app, database_url=url, outage_timeout=0.3)

    @pikku.workflow
    def fulfil_order(ctx: Any, order: dict[str, Any]) -> dict[str, Any]:
        return order

    namespace: Namespace = {"fulfil_order": fulfil_order, "order": {"id": 7, "cents": 1999}}
    began = time.monotonic()
    run_block(blocks["outage"], "outage", namespace)
    return {"started": "handle" in namespace, "waited": time.monotonic() - began}


def scenario_pooler(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The PgBouncer page's app (on memory://): built without connecting, its
    store and engine set up for transaction pooling."""
    from pikku_celery.sql.pooler import prepares_nothing

    source = substitute(blocks["pooler"], {'"redis://127.0.0.1:6379/0"': '"memory://"'})
    namespace: Namespace = {"__name__": "readme"}
    run_block(source, "pooler", namespace)
    pikku = namespace["pikku"]
    return {"pooler": pikku.store.pooler, "prepares_nothing": prepares_nothing(pikku.sql_engine)}


def scenario_events(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The progress events block on the tutorial's app and worker; what it printed."""
    namespace = tutorial(blocks, scratch)
    printed = io.StringIO()
    with worker(namespace), contextlib.redirect_stdout(printed):
        run_block(blocks["events"], "events", namespace)
    packing = namespace["packing"]
    return {
        "printed": printed.getvalue().splitlines(),
        "run": run_report(packing),
        "events": [[e.key, e.number, e.value] for e in packing.events()],
    }


def scenario_concurrency(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The concurrency page's block on the tutorial: two runs on one key, the
    second queued until the first ended."""
    namespace = tutorial(blocks, scratch)
    printed = io.StringIO()
    with worker(namespace), contextlib.redirect_stdout(printed):
        run_block(blocks["concurrency"], "concurrency", namespace)
    first, second = namespace["first"], namespace["second"]
    (ran,) = first.steps()
    (waited,) = second.steps()
    return {
        "printed": printed.getvalue().strip(),
        "statuses": [str(first.status()), str(second.status())],
        "in_turn": ran.attempts[-1].finished_at <= waited.attempts[0].started_at,
    }


def scenario_continue_as_new(blocks: dict[str, str], scratch: Path) -> dict[str, Any]:
    """The continue_as_new block on the tutorial's app and worker: the chain
    it made, from its first run."""
    namespace = tutorial(blocks, scratch)
    printed = io.StringIO()
    with worker(namespace), contextlib.redirect_stdout(printed):
        run_block(blocks["continue_as_new"], "continue_as_new", namespace)
    first = namespace["batches"]
    chain = [first]
    while (successor := chain[-1].successor()) is not None:
        chain.append(successor)
    return {
        "printed": printed.getvalue().splitlines(),
        "chain": [run_report(run) for run in chain],
    }


SCENARIOS: dict[str, Callable[[dict[str, str], Path], dict[str, Any]]] = {
    "tutorial": scenario_tutorial,
    "handles": scenario_handles,
    "transactional": scenario_transactional,
    "django": scenario_django,
    "flask": scenario_flask,
    "run_page_flask": scenario_run_page_flask,
    "run_page_django": scenario_run_page_django,
    "testing": scenario_testing,
    "tracing": scenario_tracing,
    "versioning": scenario_versioning,
    "canvas": scenario_canvas,
    "schedules": scenario_schedules,
    "pytest_celery": scenario_pytest_celery,
    "leases": scenario_leases,
    "embedded_broker": scenario_embedded_broker,
    "closing": scenario_closing,
    "outage": scenario_outage,
    "pooler": scenario_pooler,
    "events": scenario_events,
    "concurrency": scenario_concurrency,
    "continue_as_new": scenario_continue_as_new,
}


def main(argv: list[str]) -> None:
    """Run one scenario against the README and docs as they are now; print its report."""
    scenario, scratch = argv
    blocks = named_blocks()
    report = SCENARIOS[scenario](blocks, Path(scratch))
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main(sys.argv[1:])
