"""The demo: a batch of orders through real Celery workers, one of them killed.

    python -m example_project [--orders 8] [--broker URL] [--database URL] [--json] [--web]

Runs ``celery worker -B`` (prefork, 2 processes) as a subprocess on the
embedded default (SQLite store, SQLite-file broker; no server needed), starts
the orders, SIGKILLs the worker process that packs one parcel, shows progress,
and ends with a table of runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for real inside main(), once the environment is set
    from rich.console import Console

    from pikku_celery import Pikku, RunHandle

    # The demo's runs by order id: shop.fulfil_order's handles, typed by its output.
    Runs = dict[int, RunHandle[dict[str, Any]]]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m example_project", description=__doc__.split("\n")[0]
    )
    p.add_argument("--orders", type=int, default=8, help="how many orders to place (default 8)")
    p.add_argument("--broker", help="broker URL (default: an SQLite file under .pikku-demo/)")
    p.add_argument("--database", help="database URL (default: an SQLite file under .pikku-demo/)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--no-kill", action="store_true", help="do not kill a worker on purpose")
    p.add_argument("--timeout", type=float, default=90.0, help="give up after this many seconds")
    p.add_argument("--json", action="store_true", help="print the final runs as JSON")
    p.add_argument(
        "--web",
        action="store_true",
        help="then serve the run page (read-only, on loopback) until Ctrl-C; "
        "needs pikku-celery[web]",
    )
    p.add_argument("--web-port", type=int, default=5555, help="the run page's port (default 5555)")
    return p.parse_args(argv)


def _orders(n: int, kill: bool) -> list[dict[str, Any]]:
    """A scripted batch: every path of the workflow is taken at least once."""
    orders = []
    for i in range(1, n + 1):
        order: dict[str, Any] = {
            "id": i,
            "cents": 1999 + 1000 * i,
            "country": "FI",
            "lines": [{"sku": f"SKU-{i}-{k}", "qty": k + 1} for k in range(1 + i % 3)],
            "kill_order": 3 if kill else -1,
            "cooling_off": 0.5,
        }
        if i == 5:
            order["country"] = "AQ"  # shipping fails for good: refund
        if i in (6, 7):
            order["cents"] = 75_000 + i  # large: needs approval
            order["approval_timeout"] = 3 if i == 7 else 60
        orders.append(order)
    return orders


EXPECTED = {5: "refunded", 7: "rejected"}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    home = Path(os.environ.get("PIKKU_DEMO_HOME", Path.cwd() / ".pikku-demo")).resolve()
    os.environ["PIKKU_DEMO_HOME"] = str(home)
    if args.broker:
        os.environ["PIKKU_DEMO_BROKER"] = args.broker
    if args.database:
        os.environ["PIKKU_DEMO_DATABASE"] = args.database
    home.mkdir(parents=True, exist_ok=True)
    for name in ("broker.db", "shop.db", "kill-me.pid", "celerybeat-schedule", "worker.log"):
        for suffix in ("", "-wal", "-shm"):
            (home / f"{name}{suffix}").unlink(missing_ok=True)

    from rich.console import Console

    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 110)
    from example_project.app import BROKER_URL, DATABASE_URL, pikku
    from example_project.shop.tasks import KILL_MARK
    from example_project.shop.workflows import fulfil_order

    console.print(
        f"[bold]pikku-celery demo[/] · store {_safe(DATABASE_URL)} · broker {_safe(BROKER_URL)}"
    )
    log = (home / "worker.log").open("w")
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "example_project.app", "worker", "-B",
            "--pool", "prefork", "-c", str(args.workers), "-Q", "celery,shipping",
            "--loglevel", "INFO", "-s", str(home / "celerybeat-schedule"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    started = time.monotonic()
    killed: dict[str, Any] = {}
    try:
        orders = _orders(args.orders, not args.no_kill)
        runs = {o["id"]: fulfil_order.start(o, idempotency_key=f"order-{o['id']}") for o in orders}
        if 6 in runs:
            pikku.send_signal(runs[6].run_id, "approval", {"approved": True, "by": "alice"})
        _watch(console, pikku, runs, worker, KILL_MARK, killed, args.timeout)
    finally:
        _stop(worker)
        log.close()
    rows = _rows(pikku, runs, killed)
    elapsed = time.monotonic() - started
    if args.json:
        print(json.dumps({"runs": rows, "seconds": round(elapsed, 2), "killed": killed}, indent=2))
    else:
        _table(console, rows, elapsed, killed)
    ok = all(r["outcome"] == EXPECTED.get(r["order"], "shipped") for r in rows)
    if not ok:
        console.print(f"[red]some orders did not end as designed; see {home / 'worker.log'}[/]")
    if args.web:
        _serve_run_page(console, pikku, rows, args.web_port)
    return 0 if ok else 1


def _serve_run_page(console: Console, pikku: Pikku, rows: list[dict[str, Any]], port: int) -> None:
    """The run page over the demo's store, read-only on loopback, until Ctrl-C;
    its address points at the run whose worker was killed mid-step (the
    shipping child run whose 'pack' step took a second attempt), else the first."""
    from pikku_celery.web.app import create_app
    from pikku_celery.web.permissions import read_only
    from pikku_celery.web.serve import make_server

    focus = rows[0]["run_id"]
    for row in rows:
        for history in pikku.handle(row["run_id"]).steps():
            child = history.step.child_run_id
            if child and any(
                h.step.name == "pack" and h.step.attempt > 1 for h in pikku.handle(child).steps()
            ):
                focus = child
    server = make_server(create_app(pikku, read_only), "127.0.0.1", port)
    console.print(f"run page: http://127.0.0.1:{server.port}/?run={focus}  (Ctrl-C stops it)")
    server.serve_until_interrupted()


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("@")[-1]


def _watch(
    console: Console,
    pikku: Pikku,
    runs: Runs,
    worker: subprocess.Popen[bytes],
    kill_mark: Path,
    killed: dict[str, Any],
    timeout: float,
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} orders settled"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("fulfilling", total=len(runs))
        while time.monotonic() < deadline:
            if worker.poll() is not None:
                raise SystemExit(f"the celery worker exited with code {worker.returncode}")
            if kill_mark.exists() and not killed:
                pid = int(kill_mark.read_text() or 0)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed.update(pid=pid, at=round(time.monotonic(), 3))
                    progress.console.print(
                        f"[yellow]killed worker process {pid} while it packed a parcel "
                        "(SIGKILL); its lease will lapse and another process takes over[/]"
                    )
            settled = sum(1 for r in runs.values() if r.status().terminal)
            progress.update(bar, completed=settled)
            if settled == len(runs):
                return
            time.sleep(0.2)  # a display refresh, not synchronisation
    console.print("[red]timed out waiting for the orders[/]")


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is not None:
        return
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(5)


def _rows(pikku: Pikku, runs: Runs, killed: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for order_id, handle in runs.items():
        run = handle.state()
        histories = list(handle.steps())
        child_id = next((h.step.child_run_id for h in histories if h.step.child_run_id), None)
        if child_id:
            histories += pikku.handle(child_id).steps()
        attempts = sum(len(h.attempts) for h in histories)
        retried = sorted(
            f"{h.step.name} (attempt {h.step.attempt})" for h in histories if h.step.attempt > 1
        )
        output = run.output or {}
        rows.append(
            {
                "order": order_id,
                "run_id": run.id,
                "status": str(run.status),
                "outcome": output.get("outcome", str(run.status)),
                "steps": len(histories),
                "attempts": attempts,
                "retried": retried,
                "seconds": round((run.updated_at - run.created_at) / 1000, 2),
            }
        )
    return rows


def _table(
    console: Console, rows: list[dict[str, Any]], elapsed: float, killed: dict[str, Any]
) -> None:
    from rich.table import Table

    table = Table(title=f"orders after {elapsed:.1f} s")
    for col in (
        "order",
        "run",
        "status",
        "outcome",
        "steps",
        "attempts",
        "retried steps",
        "duration",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["order"]),
            r["run_id"][:8],
            r["status"],
            r["outcome"],
            str(r["steps"]),
            str(r["attempts"]),
            ", ".join(r["retried"]) or "-",
            f"{r['seconds']:.2f} s",
        )
    console.print(table)
    if killed:
        console.print(
            f"worker process {killed['pid']} was SIGKILLed mid-step; "
            "the 'pack' step above finished on attempt 2."
        )


if __name__ == "__main__":
    sys.exit(main())
