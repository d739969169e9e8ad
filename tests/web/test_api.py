"""The run page's JSON API (pikku_celery.web.api), framework-neutral, on the
in-memory store with an inline dispatcher; one test end to end on SQLite."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from pikku_celery import Context, Pikku, RunStatus
from pikku_celery.engine import WorkflowEngine
from pikku_celery.testing import make_engine
from pikku_celery.web.api import ENVELOPE_BYTES, Answer, Body, RunApi
from pikku_celery.web.permissions import allow_all, read_only
from pikku_celery.web.reads import MAX_LIMIT
from pikku_celery.web.shapes import iso
from tests.helpers import wait_until

from . import webapp
from .support import snapshot

UNKNOWN = "6f1c1e0e-1111-4222-8333-444455556666"


class Hook:
    """A permission hook recording its calls, refusing the actions it is told to."""

    def __init__(self, *refuse: str) -> None:
        self.refuse = set(refuse)
        self.calls: list[tuple[str, str]] = []

    def __call__(self, action: str, target: str) -> bool:
        self.calls.append((action, target))
        return action not in self.refuse


class Shop:
    """An engine on the memory store with the workflows the tests start."""

    def __init__(self) -> None:
        self.engine, self.dispatcher = make_engine()
        self.failing = True
        task = self.dispatcher.task

        @task(name="shop.add")
        def add(a: int, b: int) -> int:
            return a + b

        @task(name="shop.charge")
        def charge(order: Any) -> str:
            if self.failing:
                raise RuntimeError(f"card declined for {order!r}")
            return "charged"

        @self.engine.workflow(name="order")
        def order(ctx: Context, data: dict[str, int]) -> int:
            return int(ctx.step("add", add, data["a"], data["b"]))

        @self.engine.workflow(name="payment")
        def payment(ctx: Context, order: Any) -> str:
            return str(ctx.step("charge", charge, order))

        @self.engine.workflow(name="approval")
        def approval(ctx: Context) -> Any:
            return ctx.wait_for_signal("approve", timeout=3600)

        @self.engine.workflow(name="parent")
        def parent(ctx: Context) -> Any:
            return ctx.child("kid", "order", {"a": 1, "b": 1})

    def start(self, workflow: str, data: Any = None, **options: Any) -> str:
        run_id = self.engine.start(workflow, data, **options).run_id
        created = self.engine.store.get_run(run_id)
        assert created is not None
        # distinct created_at: "newest first" and the time filters are well defined
        wait_until(lambda: self.engine.store.now_ms() > created.created_at)
        return run_id

    def run(self) -> None:
        self.dispatcher.run_until_idle()


@pytest.fixture
def shop() -> Shop:
    return Shop()


def api(
    engine: WorkflowEngine, permission: Callable[[str, str], bool] = allow_all, **kw: Any
) -> RunApi:
    return RunApi(engine, permission, **kw)


def json_body(
    payload: Any = None, *, raw: bytes | None = None, mimetype: str = "application/json"
) -> Body:
    data = json.dumps(payload).encode() if raw is None else raw
    return Body(len(data), mimetype, _reader(data))


def _reader(data: bytes) -> Callable[[int], bytes]:
    stream = iter([data])

    def read(n: int) -> bytes:
        return next(stream, b"")[:n]

    return read


def unreadable(length: int | None) -> Body:
    """A body that must not be read at all."""

    def read(n: int) -> bytes:
        raise AssertionError("the body was read")

    return Body(length, "application/json", read)


def error(answer: Answer, status: int, code: str) -> str:
    assert answer.status == status, answer
    assert set(answer.body) >= {"error", "message"}
    assert answer.body["error"] == code, answer.body
    return str(answer.body["message"])


@pytest.fixture
def mixed(shop: Shop) -> dict[str, str]:
    """A completed, a failed and a running run (and a child), oldest first."""
    ids = {
        "done": shop.start("order", {"a": 2, "b": 3}, idempotency_key="order-1"),
        "failed": shop.start("payment", {"id": 9}, idempotency_key="pay-9"),
        "waiting": shop.start("approval"),
    }
    shop.run()
    return ids


# --- the runs list -----------------------------------------------------------


def test_the_list_is_newest_first_with_counts_per_status(shop: Shop, mixed: dict[str, str]) -> None:
    answer = api(shop.engine).runs({})
    assert answer.status == 200
    page = answer.body
    assert [r["id"] for r in page["runs"]] == [mixed["waiting"], mixed["failed"], mixed["done"]]
    assert page["counts"] == {
        "running": 1,
        "suspended": 0,
        "completed": 1,
        "failed": 1,
        "cancelled": 0,
        "queued": 0,
        "total": 3,
    }
    assert (page["limit"], page["offset"], page["has_more"], page["next_offset"]) == (
        50,
        0,
        False,
        None,
    )
    failed = page["runs"][1]
    assert failed["status"] == "failed" and "card declined" in failed["error"]
    assert failed["idempotency_key"] == "pay-9"
    assert ("Cache-Control", "no-store") in answer.headers
    json.dumps(page)  # JSON as it is


def test_the_list_filters_by_status_and_workflow_counts_ignore_status(
    shop: Shop, mixed: dict[str, str]
) -> None:
    failed = api(shop.engine).runs({"status": "failed"}).body
    assert [r["id"] for r in failed["runs"]] == [mixed["failed"]]
    assert failed["counts"]["total"] == 3  # what the other status filters would show
    assert failed["filters"]["status"] == "failed"
    orders = api(shop.engine).runs({"workflow": "order"}).body
    assert [r["id"] for r in orders["runs"]] == [mixed["done"]]
    assert orders["counts"]["total"] == 1 and orders["counts"]["completed"] == 1
    assert api(shop.engine).runs({"workflow": "nope", "status": ""}).body["runs"] == []


def test_the_list_filters_by_time_in_ms_iso_and_ages(shop: Shop, mixed: dict[str, str]) -> None:
    store = shop.engine.store
    created = {k: store.get_run(v).created_at for k, v in mixed.items()}  # type: ignore[union-attr]
    since, until = created["failed"], created["waiting"]
    window = api(shop.engine).runs({"since": str(since), "until": str(until)}).body
    assert [r["id"] for r in window["runs"]] == [mixed["failed"]]
    assert window["counts"]["total"] == 1
    iso = datetime.fromtimestamp(since / 1000, tz=UTC).isoformat()
    assert [r["id"] for r in api(shop.engine).runs({"since": iso}).body["runs"]] == [
        mixed["waiting"],
        mixed["failed"],
    ]
    naive = datetime.fromtimestamp(since / 1000, tz=UTC).replace(tzinfo=None).isoformat()
    assert len(api(shop.engine).runs({"since": naive}).body["runs"]) == 2  # naive is UTC
    assert len(api(shop.engine).runs({"since": "1h"}).body["runs"]) == 3
    assert api(shop.engine).runs({"until": "1h"}).body["runs"] == []


def test_the_list_finds_a_run_by_id_or_idempotency_key(shop: Shop, mixed: dict[str, str]) -> None:
    by_id = api(shop.engine).runs({"q": mixed["done"]}).body
    assert [r["id"] for r in by_id["runs"]] == [mixed["done"]]
    assert by_id["counts"]["total"] == 1
    assert [r["id"] for r in api(shop.engine).runs({"q": mixed["done"].upper()}).body["runs"]] == [
        mixed["done"]
    ]  # a UUID in any spelling
    by_key = api(shop.engine).runs({"q": "pay-9"}).body
    assert [r["id"] for r in by_key["runs"]] == [mixed["failed"]]
    assert by_key["counts"]["failed"] == 1
    assert api(shop.engine).runs({"q": "pay-9", "status": "running"}).body["runs"] == []
    assert api(shop.engine).runs({"q": "PAY-9"}).body["runs"] == []  # keys compare exactly
    assert api(shop.engine).runs({"q": UNKNOWN}).body["runs"] == []


def test_the_list_pages_with_limit_and_offset(shop: Shop) -> None:
    made = [shop.start("order", {"a": i, "b": 0}) for i in range(5)]
    newest_first = list(reversed(made))
    first = api(shop.engine).runs({"limit": "2"}).body
    assert [r["id"] for r in first["runs"]] == newest_first[:2]
    assert (first["has_more"], first["next_offset"]) == (True, 2)
    second = api(shop.engine).runs({"limit": "2", "offset": "2"}).body
    last = api(shop.engine).runs({"limit": "2", "offset": "4"}).body
    assert [r["id"] for r in second["runs"]] == newest_first[2:4]
    assert [r["id"] for r in last["runs"]] == newest_first[4:]
    assert (last["has_more"], last["next_offset"]) == (False, None)
    assert api(shop.engine).runs({"offset": "99"}).body["runs"] == []
    assert api(shop.engine).runs({"limit": str(MAX_LIMIT)}).status == 200


def test_the_list_pages_by_cursor_and_its_counts_say_whether_capped(shop: Shop) -> None:
    made = [shop.start("order", {"a": i, "b": 0}) for i in range(5)]
    pages = [api(shop.engine).runs({"limit": "2"}).body]
    while pages[-1]["next_cursor"]:
        cursor = pages[-1]["next_cursor"]
        pages.append(api(shop.engine).runs({"limit": "2", "before": cursor}).body)
        assert pages[-1]["before"] == cursor
    assert [r["id"] for p in pages for r in p["runs"]] == list(reversed(made))
    assert [len(p["runs"]) for p in pages] == [2, 2, 1]
    assert pages[0]["counts_capped"] is False and pages[0]["count_cap"] == 10_000
    assert pages[0]["counts"]["running"] == 5


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"limit": str(MAX_LIMIT + 1)}, f"limit must be from 1 to {MAX_LIMIT}"),
        ({"limit": "0"}, "limit must be from 1"),
        ({"limit": "ten"}, "not a whole number"),
        ({"limit": "9" * 5000}, "limit must be from 1"),
        ({"offset": "-1"}, "not a whole number"),
        ({"status": "lost"}, "not a run status"),
        ({"since": "yesterday"}, "neither epoch milliseconds"),
        ({"until": "99999999999999999999"}, "between 1970 and 9999"),
        ({"stauts": "failed"}, "unknown query key(s) 'stauts'"),
        ({"before": "page-2"}, "not a runs-list cursor"),
    ],
)
def test_a_bad_query_is_a_400_naming_the_key(
    shop: Shop, query: dict[str, str], message: str
) -> None:
    assert message in error(api(shop.engine).runs(query), 400, "invalid_query")


# --- one run -----------------------------------------------------------------


def test_a_run_shows_steps_attempts_errors_with_tracebacks_and_actions(
    shop: Shop, mixed: dict[str, str]
) -> None:
    answer = api(shop.engine).run(mixed["failed"])
    assert answer.status == 200
    shown = answer.body
    assert set(shown) == {
        "now",
        "run",
        "steps",
        "steps_after",
        "steps_limit",
        "next_steps",
        "steps_total",
        "step_counts",
        "signals",
        "timers",
        "children",
        "waiting",
        "audit",
        "retention",
        "events",
        "permissions",
        "actions",
    }
    run = shown["run"]
    assert (run["workflow"], run["status"], run["input"]) == ("payment", "failed", {"id": 9})
    assert run["error"]["type"] == "StepFailedError" and "Traceback" in run["error"]["traceback"]
    [step] = shown["steps"]
    assert (step["name"], step["kind"], step["status"], step["task"]) == (
        "charge",
        "task",
        "failed",
        "shop.charge",
    )
    assert (step["args"], step["kwargs"]) == ([{"id": 9}], {})
    [attempt] = step["attempts"]
    assert attempt["status"] == "failed" and attempt["worker"] == shop.engine.worker_id
    # no Celery worker ran it (an inline dispatcher): its node is the process
    assert attempt["node"] == shop.engine.worker_id and attempt["task_id"] is None
    assert attempt["claim_id"]  # and "dispatch": how it reached the worker, where known
    assert attempt["queued_at"] <= attempt["started_at"] <= attempt["finished_at"]
    assert attempt["error"]["type"] == "RuntimeError"
    assert "card declined" in attempt["error"]["message"]
    assert "Traceback" in attempt["error"]["traceback"]
    assert shown["permissions"] == {"cancel": True, "retry": True, "signal": True}
    assert shown["actions"] == {"cancel": False, "retry": True, "signal": False}  # it failed
    assert shown["retention"] == "runs are kept for good (no retention set)"
    json.dumps(shown)

    done = api(shop.engine).run(mixed["done"]).body
    assert done["run"]["output"] == 5
    [attempt] = done["steps"][0]["attempts"]
    assert (attempt["status"], attempt["result"]) == ("succeeded", 5)
    assert (attempt["renewals"], attempt["renewed_at"]) == (0, None)  # too short to renew


def test_an_attempt_shows_its_lease_renewals(shop: Shop) -> None:
    run_id = shop.engine.start("payment", {"id": 3}).run_id
    [step] = [s for s in shop.engine.store.get_steps(run_id) if s.task_name]
    assert step.task_name is not None
    store = shop.engine.store
    claimed = store.claim_step(step.id, step.task_name, "w:1", 30_000, run_id=run_id)
    assert claimed is not None
    for _ in range(3):
        assert store.refresh_step_lease(step.id, claimed.attempt, 30_000, claimed.claim_id)
    renewed = store.get_step(step.id)
    assert renewed is not None
    [attempt] = api(shop.engine).run(run_id).body["steps"][0]["attempts"]
    assert attempt["status"] == "running" and attempt["renewals"] == 3
    assert attempt["renewed_at"] == iso(renewed.updated_at)


def test_a_waiting_run_shows_its_signal_wait_its_timer_and_what_it_takes(
    shop: Shop, mixed: dict[str, str]
) -> None:
    shown = api(shop.engine).run(mixed["waiting"]).body
    assert shown["actions"] == {"cancel": True, "retry": False, "signal": True}
    [timer] = shown["timers"]
    assert (timer["step"], timer["kind"], timer["pending"]) == (
        "signal:approve",
        "signal_timeout",
        True,
    )
    assert 3590 < timer["due_in_s"] <= 3600
    assert shown["signals"] == []
    shop.engine.send_signal(mixed["waiting"], "unrelated", {"n": 1})
    signals = api(shop.engine).run(mixed["waiting"]).body["signals"]
    assert signals == [{"name": "unrelated", "payload": {"n": 1}, "taken": False}]


def test_a_parent_and_its_child_name_each_other(shop: Shop) -> None:
    parent = shop.start("parent")
    shop.run()
    shown = api(shop.engine).run(parent).body
    [child] = shown["children"]
    assert shown["steps"][0]["child_run_id"] == child
    assert api(shop.engine).run(child).body["run"]["parent_run_id"] == parent
    assert shown["run"]["status"] == "completed" and shown["run"]["output"] == 2


def test_an_unknown_run_is_a_404_and_a_malformed_id_a_400(shop: Shop) -> None:
    assert UNKNOWN in error(api(shop.engine).run(UNKNOWN), 404, "unknown_run")
    assert "not a UUID" in error(api(shop.engine).run("44"), 400, "invalid_run_id")
    assert "not a UUID" in error(
        api(shop.engine).cancel("x' OR 1=1", json_body({})), 400, "invalid_run_id"
    )
    error(api(shop.engine).cancel(UNKNOWN, json_body({})), 404, "unknown_run")
    error(api(shop.engine).signal(UNKNOWN, "go", json_body(1)), 404, "unknown_run")


# --- actions -----------------------------------------------------------------


def test_cancel_retry_and_signal_do_what_the_engine_does(shop: Shop, mixed: dict[str, str]) -> None:
    web = api(shop.engine)
    sent = web.signal(mixed["waiting"], "approve", json_body({"by": "ann"}))
    assert sent.status == 202 and sent.body["action"] == "signal"
    shop.run()
    assert shop.engine.handle(mixed["waiting"]).result() == {"by": "ann"}

    shop.failing = False
    retried = web.retry(mixed["failed"], json_body({}))
    assert retried.status == 202 and retried.body["run"]["status"] == "running"
    shop.run()
    assert shop.engine.handle(mixed["failed"]).result() == "charged"
    attempts = web.run(mixed["failed"]).body["steps"][0]["attempts"]
    assert [(a["attempt"], a["status"]) for a in attempts] == [(1, "failed"), (2, "succeeded")]

    doomed = shop.start("approval")
    shop.run()
    cancelled = web.cancel(doomed, Body(0, "application/json", lambda n: b""))  # {} or empty
    assert cancelled.status == 202 and cancelled.body["run"]["cancel_requested"] is True
    shop.run()
    assert shop.engine.handle(doomed).status() == RunStatus.CANCELLED
    assert "already cancelled" in error(web.cancel(doomed, json_body({})), 409, "run_settled")
    assert "only a failed run" in error(web.retry(doomed, json_body({})), 409, "run_settled")
    assert "takes no signals" in error(
        web.signal(doomed, "approve", json_body(1)), 409, "run_settled"
    )


def test_permission_is_asked_first_and_a_no_is_a_403(shop: Shop, mixed: dict[str, str]) -> None:
    hook = Hook("list", "status", "cancel", "retry", "signal")
    web = api(shop.engine, hook)
    assert "not allowed to list" in error(web.runs({"stauts": "bad"}), 403, "forbidden")
    error(web.run("not-a-uuid"), 403, "forbidden")  # before the id is even looked at
    error(web.run(UNKNOWN), 403, "forbidden")  # nor whether the run exists
    error(web.cancel(mixed["waiting"], unreadable(10)), 403, "forbidden")  # body unread
    error(web.retry(mixed["failed"], unreadable(None)), 403, "forbidden")
    error(web.signal(mixed["waiting"], "approve", unreadable(2)), 403, "forbidden")
    assert hook.calls == [
        ("list", "runs"),
        ("status", "not-a-uuid"),
        ("status", UNKNOWN),
        ("cancel", mixed["waiting"]),
        ("retry", mixed["failed"]),
        ("signal", mixed["waiting"]),
    ]


def test_a_hook_that_allows_reading_only_shows_no_actions(
    shop: Shop, mixed: dict[str, str]
) -> None:
    web = api(shop.engine, read_only)
    assert web.runs({}).status == 200
    shown = web.run(mixed["waiting"]).body
    assert shown["permissions"] == {"cancel": False, "retry": False, "signal": False}
    assert shown["actions"] == {"cancel": False, "retry": False, "signal": False}
    error(web.cancel(mixed["waiting"], json_body({})), 403, "forbidden")


def test_a_body_over_the_limit_is_a_413_before_it_is_read(
    shop: Shop, mixed: dict[str, str]
) -> None:
    web = api(shop.engine)
    limit = shop.engine.max_input_bytes + ENVELOPE_BYTES
    assert web.max_body_bytes == limit
    message = error(
        web.signal(mixed["waiting"], "approve", unreadable(limit + 1)), 413, "payload_too_large"
    )
    assert str(limit) in message
    error(web.cancel(mixed["waiting"], unreadable(10**12)), 413, "payload_too_large")
    # Sent chunked (no Content-Length): refused once the read passes the limit.
    asked: list[int] = []
    huge = b"[" + b"0," * 100 + b"0]"

    def read(n: int) -> bytes:
        asked.append(n)
        return huge[:n]

    small = api(shop.engine, max_body_bytes=50)
    error(
        small.signal(mixed["waiting"], "approve", Body(None, "application/json", read)),
        413,
        "payload_too_large",
    )
    assert asked == [51]  # one byte past the limit, never more


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (json_body(raw=b"{not json"), 400, "invalid_json"),
        (json_body(raw=b"\xff\xfe"), 400, "invalid_json"),
        (json_body(raw=b"{}", mimetype="text/plain"), 415, "unsupported_media_type"),
        (Body(None, None, lambda n: b""), 415, "unsupported_media_type"),  # a bare form POST
        (json_body({"force": True}), 400, "invalid_body"),
    ],
)
def test_a_body_that_is_not_json_is_refused(
    shop: Shop, mixed: dict[str, str], body: Body, status: int, code: str
) -> None:
    error(api(shop.engine).cancel(mixed["waiting"], body), status, code)


def test_a_refused_request_changes_nothing_stored(shop: Shop, mixed: dict[str, str]) -> None:
    store = shop.engine.store
    before, sent = snapshot(store), len(shop.dispatcher.sent)
    web, deny = api(shop.engine), api(shop.engine, Hook("cancel", "retry", "signal"))
    waiting, failed, done = mixed["waiting"], mixed["failed"], mixed["done"]
    refused = [
        deny.cancel(waiting, json_body({})),
        deny.retry(failed, json_body({})),
        deny.signal(waiting, "approve", json_body(True)),
        web.cancel(waiting, unreadable(10**9)),
        web.signal(waiting, "approve", json_body(raw=b"{nope")),
        web.signal(waiting, "approve", json_body(raw=b"true", mimetype="text/plain")),
        web.signal(waiting, "", json_body(True)),  # not a name
        web.signal(waiting, "approve", json_body(raw=b'{"when": NaN}')),
        web.signal(waiting, "x" * 300, json_body(True)),
        web.cancel(waiting, json_body({"now": 1})),
        web.cancel("not-an-id", json_body({})),
        web.retry(done, json_body({})),
        web.cancel(done, json_body({})),
        web.signal(done, "approve", json_body(True)),
        web.cancel(UNKNOWN, json_body({})),
    ]
    assert [a.status for a in refused] == [403] * 3 + [413] + [400] + [415] + [400] * 5 + [
        409
    ] * 3 + [404]
    assert snapshot(store) == before
    assert len(shop.dispatcher.sent) == sent  # no wake-up went out either


# --- end to end on SQLite ----------------------------------------------------


def test_end_to_end_on_sqlite(sqlite_pikku: Pikku) -> None:
    done = sqlite_pikku.start(webapp.ORDER, {"a": 2, "b": 3}, idempotency_key="order-1").run_id
    webapp.drive(sqlite_pikku, done)
    waiting = sqlite_pikku.start(webapp.WAITS, None).run_id
    webapp.drive(sqlite_pikku, waiting)
    web = RunApi(sqlite_pikku, allow_all)
    page = web.runs({"q": "order-1"}).body
    assert [r["id"] for r in page["runs"]] == [done]
    assert web.runs({}).body["counts"]["total"] == 2
    shown = web.run(done).body
    assert shown["run"]["output"] == {"total": 5, "label": "parcel-5"}
    assert [s["name"] for s in shown["steps"]] == ["add", "label"]
    before = snapshot(sqlite_pikku.store)
    assert web.signal(waiting, "approval", json_body(raw=b"[1,")).status == 400
    assert snapshot(sqlite_pikku.store) == before
    assert web.signal(waiting, "approval", json_body("yes")).status == 202
    assert web.run(waiting).body["signals"] == [
        {"name": "approval", "payload": "yes", "taken": False}
    ]
    sqlite_pikku.orchestrate(waiting, "test")
    shown = web.run(waiting).body
    assert shown["run"]["status"] == "completed"
    assert shown["signals"] == [{"name": "approval", "payload": "yes", "taken": True}]
