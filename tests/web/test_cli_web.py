"""``pikku-celery web``: what it refuses before binding, and a real server.

The real one runs as a user runs it, in a subprocess (``-A tests.cli.cliapp``
on an SQLite file), and is stopped with Ctrl-C (SIGINT).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pikku_celery.cli import main
from pikku_celery.web.serve import Exposure, HostGuard, RemoteBindError, is_loopback

from . import webapp

ROOT = Path(__file__).resolve().parents[2]
A = ("-A", "tests.cli.cliapp")


def cli(*args: str, tmp_path: Path) -> Any:
    env = {"PIKKU_CLI_TEST_DB": str(tmp_path / "cli.db"), "PIKKU_APP": ""}
    return CliRunner().invoke(main, list(args), env=env)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org", "127.0.0.2"])
def test_it_refuses_to_bind_beyond_loopback_without_a_hook(tmp_path: Path, host: str) -> None:
    result = cli(*A, "web", "--host", host, "--allow-actions", tmp_path=tmp_path)
    assert result.exit_code == 2, result.output
    assert f"refusing to serve the run page on {host!r}" in result.output
    assert "--permission" in result.output and "--allow-remote" in result.output


def test_it_refuses_options_that_contradict_or_name_nothing(tmp_path: Path) -> None:
    both = cli(*A, "web", "--permission", "m:f", "--allow-actions", tmp_path=tmp_path)
    assert both.exit_code == 2 and "the hook decides" in both.output
    missing = cli(*A, "web", "--permission", "no_such_module:hook", tmp_path=tmp_path)
    assert missing.exit_code == 2 and "cannot import 'no_such_module'" in missing.output
    shape = cli(*A, "web", "--permission", "just_a_module", tmp_path=tmp_path)
    assert shape.exit_code == 2 and "is not MODULE:ATTR" in shape.output
    not_callable = cli(*A, "web", "--permission", "tests.web.webapp:ORDER", tmp_path=tmp_path)
    assert not_callable.exit_code == 2 and "not a permission" in not_callable.output
    no_app = cli("web", tmp_path=tmp_path)
    assert no_app.exit_code == 2 and "-A" in no_app.output
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    no_app_to_act = cli("web", "--database-url", url, "--allow-actions", tmp_path=tmp_path)
    assert no_app_to_act.exit_code == 2 and "--allow-actions needs -A" in no_app_to_act.output


def test_exposure_rules() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "::1", "[::1]", "localhost", "LOCALHOST"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "127.0.0.2", "localhost.evil", ""))
    Exposure("0.0.0.0", has_permission=True, allow_remote=False, allow_actions=False).check()
    Exposure("0.0.0.0", has_permission=False, allow_remote=True, allow_actions=True).check()
    with pytest.raises(RemoteBindError):
        Exposure("0.0.0.0", has_permission=False, allow_remote=False, allow_actions=False).check()
    local = Exposure("127.0.0.1", has_permission=False, allow_remote=False, allow_actions=False)
    assert local.guard_hosts and "read-only" in local.describe()
    hooked = Exposure("127.0.0.1", has_permission=True, allow_remote=False, allow_actions=False)
    assert not hooked.guard_hosts and "hook decides" in hooked.describe()


@pytest.mark.parametrize(
    ("host", "passed"),
    [
        ("127.0.0.1:5555", True),
        ("localhost", True),
        ("[::1]:5555", True),
        ("evil.example:5555", False),
        ("127.0.0.1.evil.example", False),
        ("", False),
    ],
)
def test_the_host_guard_answers_only_loopback_names(host: str, passed: bool) -> None:
    seen: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(environ["HTTP_HOST"])
        start_response("200 OK", [])
        return [b"ok"]

    statuses: list[str] = []
    body = HostGuard(app)({"HTTP_HOST": host}, lambda status, headers: statuses.append(status))
    assert (seen == [host]) is passed
    if not passed:
        assert statuses == ["421 Misdirected Request"] and b"misdirected" in b"".join(body)


def get(url: str, host: str | None = None, data: bytes | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if host:
        headers["Host"] = host
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_the_command_serves_the_page_read_only_on_loopback(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    pikku = webapp.build(f"sqlite:///{db}")
    run_id = pikku.start(webapp.WAITS, None).run_id
    webapp.drive(pikku, run_id)
    env = {**os.environ, "PIKKU_CLI_TEST_DB": str(db), "PYTHONUNBUFFERED": "1"}
    env.pop("PIKKU_APP", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "pikku_celery.cli", *A, "web", "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    try:
        first = server.stdout.readline()
        assert first.startswith("serving the run page on http://127.0.0.1:"), first
        url = first.split(" on ", 1)[1].strip()
        assert "read-only" in server.stdout.readline()

        status, page = get(url)
        assert status == 200 and b'data-api="/api/"' in page
        status, body = get(f"{url}api/runs")
        assert status == 200 and [r["id"] for r in json.loads(body)["runs"]] == [run_id]
        status, body = get(f"{url}api/runs/{run_id}")
        assert json.loads(body)["actions"] == {"cancel": False, "retry": False, "signal": False}
        status, body = get(f"{url}api/runs/{run_id}/cancel", data=b"{}")
        assert status == 403 and json.loads(body)["error"] == "forbidden"
        status, _ = get(f"{url}api/runs", host="rebound.example:80")  # DNS rebinding
        assert status == 421
        status, _ = get(f"{url}workflows/order/runs", data=b'{"input": {"a": 1, "b": 2}}')
        assert status == 403  # the blueprint's start: never allowed without a hook
    finally:
        server.send_signal(signal.SIGINT)  # Ctrl-C
        output, _ = server.communicate(timeout=20)
    assert server.returncode == 0, output
    assert pikku.store.get_run(run_id) is not None
    assert not pikku.store.get_run(run_id).cancel_requested  # type: ignore[union-attr]
    assert pikku.sql_engine is not None
    pikku.sql_engine.dispose()


def allow_everything(action: str, target: str) -> bool:
    """A hook that would let anyone do anything (``--permission`` in a subprocess)."""
    return True


def test_with_only_a_database_url_the_page_is_read_only_whatever_the_hook(
    tmp_path: Path,
) -> None:
    db = tmp_path / "store.db"
    pikku = webapp.build(f"sqlite:///{db}")
    run_id = pikku.start(webapp.WAITS, None).run_id
    webapp.drive(pikku, run_id)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PIKKU_APP", None)
    hook = "tests.web.test_cli_web:allow_everything"
    argv = ["web", "--port", "0", "--database-url", f"sqlite:///{db}", "--permission", hook]
    server = subprocess.Popen(
        [sys.executable, "-m", "pikku_celery.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert server.stdout is not None
    try:
        first = server.stdout.readline()
        assert first.startswith("serving the run page on http://127.0.0.1:"), first
        url = first.split(" on ", 1)[1].strip()
        assert "hook decides" in server.stdout.readline()
        assert "read-only: no app (-A)" in server.stdout.readline()
        status, body = get(f"{url}api/runs")
        assert status == 200 and [r["id"] for r in json.loads(body)["runs"]] == [run_id]
        status, body = get(f"{url}api/runs/{run_id}")
        assert json.loads(body)["actions"] == {"cancel": False, "retry": False, "signal": False}
        for action in ("cancel", "retry", "signals/go"):
            status, body = get(f"{url}api/runs/{run_id}/{action}", data=b"{}")
            assert status == 403 and json.loads(body)["error"] == "forbidden"
        status, _ = get(f"{url}metrics")
        assert status == 200
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=20)
    assert server.returncode == 0, output
    stored = pikku.store.get_run(run_id)
    assert stored is not None and not stored.cancel_requested and stored.status.value == "running"
    assert pikku.store.get_signals(run_id) == {}
    assert pikku.sql_engine is not None
    pikku.sql_engine.dispose()
