"""The python snippets of README.md and the docs pages are current, working
API (issue 6, must-show 5), and the README links into the docs (issue 27).

Each scenario runs the snippets for real in a process of its own (see
``tests/readme_snippets.py`` for why and for the few substitutions): the
tutorial's workflow completes on an in-process Celery worker, the
transactional step's insert lands, the Django settings pass the system check
and ``start_on_commit`` starts nothing on rollback, and the Flask blueprint
answers. A new python block in the README or in ``docs/`` fails here until
it is taught.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.readme_snippets import BLOCKS, DOCS, README, ROOT, all_blocks, named_blocks


def run_scenario(scenario: str, scratch: Path) -> dict[str, Any]:
    """Run one scenario of ``tests/readme_snippets.py``; its JSON report."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.readme_snippets", scenario, str(scratch)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"README snippets ({scenario}) failed:\n{done.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_every_python_block_of_the_readme_and_the_docs_is_run_here() -> None:
    blocks = named_blocks()  # raises on a block no scenario runs, or copies that differ
    assert sorted(blocks) == sorted(BLOCKS)
    assert {block for _where, block in all_blocks()} == set(blocks.values())


def test_the_readme_s_short_example_is_the_tested_tutorial() -> None:
    """The front page shows the tutorial and its start, as the docs do (the
    copies cannot differ: :func:`named_blocks` refuses that)."""
    readme = named_blocks([(where, b) for where, b in all_blocks() if where == "README.md"])
    assert sorted(readme) == ["schedules", "start", "tutorial"]


def test_copies_of_a_snippet_that_differ_are_refused() -> None:
    tutorial = named_blocks()["tutorial"]
    edited = tutorial.replace("retries=3", "retries=4")
    assert edited != tutorial
    with pytest.raises(LookupError, match=r"differs between README.md and docs/guide/x.md"):
        named_blocks([("README.md", tutorial), ("docs/guide/x.md", edited)])


def test_the_readme_links_into_every_guide_of_the_docs() -> None:
    text = README.read_text()
    targets = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links into no docs page"
    missing = [t for t in targets if not (ROOT / t).is_file()]
    assert not missing, f"README links to missing pages: {missing}"
    guides = {p.relative_to(ROOT).as_posix() for p in (DOCS / "guide").glob("*.md")}
    assert guides - set(targets) == set(), "guides the README does not link to"


def test_transactional_goes_above_app_task() -> None:
    lines = named_blocks()["transactional"].splitlines()
    assert lines.index("@transactional  # above @app.task") + 1 == lines.index("@app.task")


def test_the_tutorial_run_completes_on_a_worker(tmp_path: Path) -> None:
    report = run_scenario("tutorial", tmp_path)
    assert report["run"]["status"] == "completed"
    assert report["run"]["idempotency_key"] == "order-7"
    assert report["run"]["steps"] == ["charge", "cooling-off", "label"]
    # The tutorial's tasks are stubs (``...``): both results are None.
    assert report["output"] == {"charge": None, "label": None}


def test_the_handles_block_reads_a_run_back_by_its_id(tmp_path: Path) -> None:
    report = run_scenario("handles", tmp_path)
    assert report["same_id"] is True
    assert report["run"]["status"] == "completed"
    assert report["run"]["idempotency_key"] == "order-8"
    assert report["output"] == {"charge": None, "label": None}
    # The default name is module.function (the tutorial runs as module "readme").
    assert report["workflow"] == "readme.fulfil_order"
    assert report["attempts"] == [1, 0, 1]  # a timer takes no attempt
    assert report["printed"][0] in ("running", "completed")
    assert report["printed"][1:] == [
        "charge succeeded succeeded",
        "cooling-off succeeded",
        "label succeeded succeeded",
    ]


def test_the_transactional_step_commits_its_insert(tmp_path: Path) -> None:
    report = run_scenario("transactional", tmp_path)
    assert report["run"]["status"] == "completed"
    assert report["output"] == "booked"
    assert report["ledger"] == [{"order": 7, "cents": 1999}]


def test_the_django_snippets(tmp_path: Path) -> None:
    report = run_scenario("django", tmp_path)
    # The settings block, as a project's settings: no system check complains, and
    # the Pikku is built on CELERY_APP over the DATABASES alias, with OPTIONS.
    assert report["checks"] == []
    assert report["pikku_app_is_proj_celery_app"] is True
    assert report["pikku_database"] == f"sqlite:///{tmp_path / 'django.db'}"
    assert report["sweep_interval"] == 30
    # start_on_commit: a rolled-back order starts nothing; a committed one its run.
    rolled_back, committed = report["rolled_back"], report["committed"]
    assert rolled_back["runs"] == []
    assert committed["runs"] == [f"order-{committed['order']}"]
    assert report["run"]["status"] == "completed", report["output"]
    assert report["output"] == {"charge": None, "label": None}


def test_the_flask_snippet(tmp_path: Path) -> None:
    report = run_scenario("flask", tmp_path)
    assert report["extension"] == "PikkuFlask"
    start, status, refused = report["start"], report["status"], report["refused"]
    assert start["status_code"] == 202
    assert start["json"]["workflow"] == "readme.fulfil_order"
    assert start["json"]["idempotency_key"] == "order-9"
    assert status["status_code"] == 200
    assert status["json"]["id"] == start["json"]["id"]
    assert [s["name"] for s in status["json"]["steps"]] == ["charge"]
    # The permission hook reads current_user.is_staff: a non-staff user is refused.
    assert refused["status_code"] == 403
    assert refused["json"]["error"] == "forbidden"


def test_the_run_page_s_flask_mount(tmp_path: Path) -> None:
    report = run_scenario("run_page_flask", tmp_path)
    assert report["listed"] == {"status_code": 200, "ids": [report["run_id"]]}
    assert report["shown"] == {"status_code": 200, "workflow": "readme.fulfil_order"}
    assert report["page"] == {"status_code": 200, "html": True}
    assert report["refused"] == 403  # the hook reads current_user.is_staff


def test_the_run_page_s_django_include(tmp_path: Path) -> None:
    report = run_scenario("run_page_django", tmp_path)
    assert report["anonymous"] == 403  # the default hook: staff only
    assert report["listed"] == {"status_code": 200, "ids": [report["run_id"]]}


def test_the_testing_section_runs_under_pytest(tmp_path: Path) -> None:
    report = run_scenario("testing", tmp_path)
    # Both tests pass on a broker and a database that do not exist, and the
    # 30 s cooling-off sleep takes no time.
    assert report["returncode"] == 0, report["output"]
    assert "2 passed" in report["output"]
    assert report["seconds"] < 30


def test_the_tracing_snippet_makes_one_trace_per_run(tmp_path: Path) -> None:
    report = run_scenario("tracing", tmp_path)
    assert report["output"] == [1, 2]
    spans = report["spans"]
    [run] = [s for s in spans if s["name"] == "pikku.run readme.traced"]
    attempts = [s for s in spans if s["name"] == "pikku.attempt readme.traced.echo"]
    assert sorted(a["attributes"]["pikku.step"] for a in attempts) == ["one", "two"]
    assert all(a["parent_id"] == run["span_id"] for a in attempts)
    assert run["attributes"]["pikku.run_id"] == report["run_id"]
    # Celery's instrumentation, switched on by the snippet, lands in the same trace.
    celery_spans = [s for s in spans if s["name"].startswith(("run/", "apply_async/"))]
    assert celery_spans
    assert {s["trace_id"] for s in spans} == {run["trace_id"]}


def test_the_versioning_blocks_patch_and_pin(tmp_path: Path) -> None:
    report = run_scenario("versioning", tmp_path)
    assert report["ship_order"]["status"] == "completed"
    assert report["ship_order"]["steps"] == ["charge", "patch:gift-wrap", "wrap", "label"]
    assert report["refund"]["status"] == "completed"
    assert report["refund"]["steps"] == ["label", "charge-back"]  # version 2's path
    shipped, refund = report["versions"]
    assert shipped.startswith("src:") and refund == "2"
    assert report["check"] == {"checked": 2, "ok": True}


def test_the_leases_block_keeps_every_lease_within_step_lease_and_its_horizon(
    tmp_path: Path,
) -> None:
    report = run_scenario("leases", tmp_path)
    assert report["reports"] == {"seconds": 60.0, "horizon": 900.0}  # min(900, step_lease)
    assert report["celery"] == {"seconds": 60.0, "horizon": 300.0}  # default_lease


def test_the_embedded_broker_block_carries_a_message_through_its_file(tmp_path: Path) -> None:
    report = run_scenario("embedded_broker", tmp_path)
    assert report == {"body": {"hello": "broker"}, "file": True}


def test_the_closing_block_closes_twice_and_the_pikku_still_serves(tmp_path: Path) -> None:
    report = run_scenario("closing", tmp_path)
    assert set(report["done"]) == set(report["after_close"]) == {"charge", "label"}


def test_the_outage_block_gives_up_after_outage_timeout_with_nothing_started(
    tmp_path: Path,
) -> None:
    report = run_scenario("outage", tmp_path)
    assert report["started"] is False
    assert report["waited"] >= 0.3  # it waited out outage_timeout first


def test_the_durable_canvas_block_runs_its_chain_and_chord(tmp_path: Path) -> None:
    report = run_scenario("canvas", tmp_path)
    assert report["printed"] == [
        "36",
        "['canvas.0', 'canvas.1.h0', 'canvas.1.h1', 'canvas.1.body']",
    ]
    assert report["run"]["status"] == "completed"
    assert report["run"]["idempotency_key"] == "totals-1"
    assert report["workflow"] == "pikku.canvas"
    assert report["same_run_again"] is True


def test_the_pytest_celery_section_runs_under_pytest(tmp_path: Path) -> None:
    report = run_scenario("pytest_celery", tmp_path)
    # Once per broker of pytest-celery's matrix (Redis, RabbitMQ), on real workers.
    assert report["returncode"] == 0, report["output"]
    assert "2 passed" in report["output"]


def test_the_pgbouncer_block_sets_transaction_pooling_up(tmp_path: Path) -> None:
    report = run_scenario("pooler", tmp_path)
    assert report == {"pooler": "transaction", "prepares_nothing": True}


def test_the_progress_events_block_sets_and_reads_its_events(tmp_path: Path) -> None:
    report = run_scenario("events", tmp_path)
    assert report["run"]["status"] == "completed"
    assert [e[2] for e in report["events"]] == [{"packed": i, "of": 3} for i in range(4)]
    first, every = report["printed"]
    assert "'of': 3" in first  # the latest value when it asked, whichever that was
    assert every == str([{"packed": i, "of": 3} for i in range(4)])


def test_the_concurrency_block_runs_its_two_runs_in_turn(tmp_path: Path) -> None:
    report = run_scenario("concurrency", tmp_path)
    assert report == {
        "printed": "None None",  # the tutorial's tasks are stubs
        "statuses": ["completed", "completed"],
        "in_turn": True,
    }


def test_the_schedules_block_defines_both_and_a_tick_starts_its_run(tmp_path: Path) -> None:
    report = run_scenario("schedules", tmp_path)
    assert report["schedules"] == ["nightly-check", "prices"]
    assert report["beat"] == "pikku.schedules"
    assert report["nightly"] == "cancel_previous"
    assert report["started"] == [["prices", True]]
    assert report["outputs"] == [None]  # the snippet's task is a stub


def test_the_continue_as_new_block_makes_a_chain_its_wait_follows(tmp_path: Path) -> None:
    report = run_scenario("continue_as_new", tmp_path)
    chain = report["chain"]
    assert [run["status"] for run in chain] == ["completed"] * 3
    assert [len(run["steps"]) for run in chain] == [10, 10, 5]  # a fresh history each
    assert [run["output"] for run in chain] == [None, None, 25]
    assert report["printed"] == ["25", chain[1]["run_id"]]
