"""What a person needs to follow a run on the page's API: each step's
arguments, each attempt's Celery task id and node, what operators did to the
run (a retried run keeps its earlier failure) and what a live run waits for."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pikku_celery import Pikku, RunStatus
from pikku_celery.store import Delivery, Operator
from pikku_celery.web.api import Body, RunApi
from pikku_celery.web.permissions import allow_all

from . import webapp
from .support import snapshot

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ALICE = Operator("alice", "10.0.0.7")


def no_arguments() -> Body:
    return Body(2, "application/json", lambda n: b"{}"[:n])


def payload(text: str) -> Body:
    data = text.encode()
    return Body(len(data), "application/json", lambda n: data[:n])


@pytest.fixture
def pikku() -> Pikku:
    return webapp.build(name="audit")


def failed_run(pikku: Pikku) -> str:
    run_id = pikku.start(webapp.FAILS, {"order": 7}).run_id
    webapp.drive(pikku, run_id, delivery=Delivery("task-one", "celery@shop-1"))
    assert pikku.handle(run_id).status() == RunStatus.FAILED
    return run_id


def test_a_retried_run_keeps_its_failure_and_says_who_retried_it(pikku: Pikku) -> None:
    api = RunApi(pikku, allow_all)
    run_id = failed_run(pikku)
    failed = api.run(run_id).body["run"]["error"]
    answer = api.retry(run_id, no_arguments(), ALICE)
    assert answer.status == 202
    shown = api.run(run_id).body
    assert shown["run"]["status"] == "running" and shown["run"]["error"] is None
    [entry] = shown["audit"]
    assert (entry["action"], entry["actor"], entry["origin"]) == ("retry", "alice", "10.0.0.7")
    assert ISO_Z.match(entry["at"]) and shown["run"]["created_at"] <= entry["at"]
    assert entry["details"]["previous_error"] == failed  # the run's error, whole
    assert entry["details"]["failed_steps"] == ["explode"]

    [retried] = pikku.store.get_steps(run_id)  # failed, its next attempt due
    webapp.run_step(pikku, retried, Delivery("task-two", "celery@shop-2"))
    shown = api.run(run_id).body
    assert shown["run"]["status"] == "failed"
    [step] = shown["steps"]
    first, second = step["attempts"]
    assert (first["status"], first["error"]["type"]) == ("failed", "RuntimeError")
    assert (first["task_id"], first["node"], first["task_id_of"]) == (
        "task-one",
        "celery@shop-1",
        "message",
    )
    assert (second["task_id"], second["node"]) == ("task-two", "celery@shop-2")
    # it waited for a worker from the retry, not from the failure: the run
    # was failed in between
    assert first["finished_at"] <= entry["at"] == second["queued_at"] <= second["started_at"]
    assert first["worker"] == second["worker"] == pikku.worker_id  # the lease holder
    assert [e["action"] for e in shown["audit"]] == ["retry"]


def test_cancel_and_signal_are_kept_with_their_arguments_and_refusals_are_not(
    pikku: Pikku,
) -> None:
    run_id = pikku.start(webapp.WAITS, None).run_id
    webapp.drive(pikku, run_id)
    before = snapshot(pikku.store)
    refused = RunApi(pikku, lambda action, target: action != "signal")
    assert refused.signal(run_id, "approval", payload("true"), ALICE).status == 403
    assert snapshot(pikku.store) == before  # no audit entry for what was refused

    api = RunApi(pikku, allow_all)
    assert api.signal(run_id, "approval", payload('{"ok": true}'), ALICE).status == 202
    pikku.cancel(run_id)  # the Python API: nobody named
    trail = api.run(run_id).body["audit"]
    assert [(e["action"], e["actor"], e["origin"]) for e in trail] == [
        ("signal", "alice", "10.0.0.7"),
        ("cancel", "api", None),
    ]
    assert trail[0]["details"] == {"name": "approval", "payload": {"ok": True}}
    assert trail[0]["at"] <= trail[1]["at"]


def test_a_large_signal_payload_is_kept_as_its_start_in_the_trail(pikku: Pikku) -> None:
    run_id = pikku.start(webapp.WAITS, None).run_id
    pikku.send_signal(run_id, "bulk", {"rows": "x" * 10_000}, by=ALICE)
    [entry] = pikku.store.audit_trail(run_id)
    assert entry.details["name"] == "bulk" and "payload" not in entry.details
    assert str(entry.details["payload_preview"]).startswith('{"rows":"xxx')
    assert entry.details["payload_chars"] > 10_000
    assert pikku.store.get_signals(run_id)["bulk"] == {"rows": "x" * 10_000}  # whole there


def test_steps_show_their_arguments_whole(pikku: Pikku) -> None:
    long_note = "n" * 5_000
    run_id = pikku.start(webapp.ORDER, {"a": 1, "b": 2}).run_id
    webapp.drive(pikku, run_id)
    steps = RunApi(pikku, allow_all).run(run_id).body["steps"]
    assert [(s["name"], s["args"], s["kwargs"]) for s in steps] == [
        ("add", [1, 2], {}),
        ("label", [3], {}),
    ]
    other = pikku.start(webapp.FAILS, {"note": long_note}).run_id
    [step] = RunApi(pikku, allow_all).run(other).body["steps"]
    assert step["args"] == [{"note": long_note}]  # the page cuts it for display, not the API


def test_the_list_says_which_runs_wait_for_a_signal_or_sleep(pikku: Pikku) -> None:
    waits = pikku.start(webapp.WAITS, None).run_id
    sleeps = pikku.start(webapp.PACKS, 5).run_id
    done = pikku.start(webapp.ORDER, {"a": 1, "b": 2}).run_id
    for run_id in (waits, sleeps, done):
        webapp.run_step(pikku, webapp.due_steps(pikku, run_id)[0])
    webapp.drive(pikku, done)
    listing = RunApi(pikku, allow_all).runs({}).body
    by_id: dict[str, Any] = {r["id"]: r for r in listing["runs"]}
    signal = by_id[waits]["waiting"]
    assert (signal["for"], signal["name"], signal["step"]) == (
        "signal",
        "approval",
        "signal:approval",
    )
    assert ISO_Z.match(signal["until"])  # its timeout
    sleep = by_id[sleeps]["waiting"]
    assert (sleep["for"], sleep["step"]) == ("sleep", "cool-off")
    assert ISO_Z.match(sleep["until"]) and sleep["until"] > by_id[sleeps]["created_at"]
    assert by_id[done]["status"] == "completed" and by_id[done]["waiting"] is None
    shown = RunApi(pikku, allow_all).run(waits).body
    assert shown["waiting"] == signal


def test_every_time_in_an_answer_is_iso_utc_with_z(pikku: Pikku) -> None:
    run_id = failed_run(pikku)
    RunApi(pikku, allow_all).retry(run_id, no_arguments(), ALICE)
    shown = RunApi(pikku, allow_all).run(run_id).body
    times = list(_times(shown))
    assert len(times) > 8
    assert all(ISO_Z.match(t) for t in times), times


def _times(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _times(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _times(v, key)
    elif isinstance(value, str) and (key.endswith("_at") or key in ("now", "at", "until")):
        yield value


def test_the_flask_mount_names_who_acted_and_from_where(pikku: Pikku) -> None:
    from flask import Flask

    from pikku_celery.contrib.flask import make_blueprint

    app = Flask(__name__)
    app.register_blueprint(
        make_blueprint(
            pikku, permission=lambda a, t: True, run_page=True, identity=lambda: "carol"
        ),
        url_prefix="/ops",
    )
    anonymous = Flask(__name__)
    anonymous.register_blueprint(
        make_blueprint(pikku, permission=lambda a, t: True, run_page=True), url_prefix="/ops"
    )
    run_id = pikku.start(webapp.WAITS, None).run_id
    client = app.test_client()
    sent = client.post(f"/ops/api/runs/{run_id}/signals/approval", json=True)
    assert sent.status_code == 202
    cancelled = anonymous.test_client().post(
        f"/ops/runs/{run_id}/cancel", environ_base={"REMOTE_ADDR": "192.0.2.9"}
    )
    assert cancelled.status_code == 202
    trail = [(e.action.value, e.actor, e.origin) for e in pikku.store.audit_trail(run_id)]
    assert trail == [("signal", "carol", "127.0.0.1"), ("cancel", "api", "192.0.2.9")]
