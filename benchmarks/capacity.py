"""What one PostgreSQL carries: concurrent workflow runs on 1, 2 and 4 worker processes.

    python benchmarks/capacity.py [--workers 1,2,4] [--modes eager,broker] [--pgbouncer]
                                  [--runs 40] [--steps 10] [--rounds 3]

For each worker count N (one ``celery worker --pool prefork -c N``, Redis
broker, a scratch database on the machine's PostgreSQL) and each mode (eager
steps, the default; ``broker``: ``eager_steps=False``, every step a broker
message), R rounds of C concurrent M-step runs, each round beside C plain
Celery chains of M links on the same worker (the chain's rows: links/s).
With ``--pgbouncer`` every connection (the workers' and this script's) goes
through a PgBouncer in transaction pooling that the script starts
(``Pikku(pooler="transaction")``).

Per row:
- steps/s: C*M over the round's wall time (first start to last run settled),
  the median of the rounds and their range;
- PostgreSQL CPU seconds per 1,000 steps: ``pg_stat_statements``' execution
  time when the server preloads it, else the CPU (``/proc``, utime + stime) of
  the server processes serving this database, sampled through the rounds;
  beside it the whole server's (every backend and background process, WAL
  writer and checkpointer included, and whoever else uses the server then);
- commits per step: ``pg_stat_database.xact_commit`` of this database over the
  mode's rounds (read once idle backends have reported, PostgreSQL's 10 s
  idle interval later), less this script's own polls; runs' starts included;
- p50/p99 step latency: per step, from the previous step's outcome (the
  run's start for the first) to its own, on the database clock;
- the workers' (and PgBouncer's) CPU per 1,000 steps.

The machine has 2 vCPUs that the workers, PostgreSQL, Redis and this script
share (and, on a development machine, other people's work): the curve bends
where they run out, not where PostgreSQL alone would. The line "one
PostgreSQL vCPU carries about N steps/s" is 1,000 over the CPU seconds the
database's own processes spent per 1,000 steps.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
ADMIN_URL = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("PIKKU_BENCH_REDIS", "redis://127.0.0.1:6379/12")
TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_EVERY = 0.1
STATS_SETTLE = 11.0
ROUND_TIMEOUT = 300.0
MODES = {"eager": "linear", "broker": "linear_broker"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default="1,2,4", help="worker process counts, comma separated")
    p.add_argument("--modes", default="eager,broker", help="eager, broker (comma separated)")
    p.add_argument("--pgbouncer", action="store_true", help="every connection through PgBouncer")
    p.add_argument("--runs", type=int, default=40, help="concurrent runs a round")
    p.add_argument("--steps", type=int, default=10, help="steps a run")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}: one of {', '.join(MODES)}")

    tag = f"pikku_cap_{uuid.uuid4().hex[:8]}"
    os.environ.setdefault("PGAPPNAME", tag)
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {tag}")
    direct_url = sa.make_url(ADMIN_URL).set(database=tag).render_as_string(hide_password=False)
    sys.path.insert(0, str(ROOT))
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        stack.callback(drop_database, admin, tag)
        from pikku_celery.store import migrate

        migrate.upgrade(direct_url)
        db_url, bouncer_pid = direct_url, None
        if args.pgbouncer:
            from tests.pgbouncer import pgbouncer

            bouncer = stack.enter_context(pgbouncer(ADMIN_URL, "transaction"))
            db_url = bouncer.url(direct_url)
            assert bouncer.process is not None
            bouncer_pid = bouncer.process.pid
        env = {
            **os.environ,
            "PIKKU_BENCH_BROKER": REDIS,
            "PIKKU_BENCH_DB": db_url,
            "PIKKU_BENCH_QUEUE": tag,
            **({"PIKKU_BENCH_POOLER": "transaction"} if args.pgbouncer else {}),
        }
        os.environ.update(env)
        from benchmarks import benchapp

        stack.callback(lambda: benchapp.pikku.sql_engine.dispose())  # type: ignore[union-attr]
        meter = Meter(admin, tag, bouncer_pid)
        poller = sa.create_engine(direct_url, isolation_level="AUTOCOMMIT", pool_size=1)
        stack.callback(poller.dispose)
        for n in workers:
            worker = start_worker(env, tag, n)
            try:
                warm_up(benchapp, args.steps)
                meter.worker_pid = worker.pid
                for mode in modes:
                    print(f"{n} worker process(es), {mode} steps ...", file=sys.stderr)
                    rows.append(
                        measure(
                            benchapp, meter, poller, n, mode, args.runs, args.steps, args.rounds
                        )
                    )
            finally:
                stop_worker(worker)
    report(args, rows, meter.source)
    return 0


def drop_database(admin: sa.Engine, tag: str) -> None:
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag} WITH (FORCE)")
    admin.dispose()


def start_worker(env: dict[str, str], queue: str, n: int) -> subprocess.Popen[bytes]:
    log = open(f"/tmp/{queue}-worker.log", "ab")  # noqa: SIM115 - the worker's for its life
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker",
         "--pool", "prefork", "-c", str(n), "-Q", queue, "--without-gossip",
         "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def stop_worker(w: subprocess.Popen[bytes]) -> None:
    if w.poll() is None:
        os.kill(w.pid, signal.SIGTERM)
        try:
            w.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(w.pid, signal.SIGKILL)
            w.wait(10)


def warm_up(benchapp: Any, steps: int) -> None:
    """Every pool process up, connected and past its first replay."""
    benchapp.inc.delay(0).get(timeout=120)
    for name in MODES.values():
        handles = [getattr(benchapp, name).start(steps) for _ in range(8)]
        assert all(h.wait(timeout=120) == steps for h in handles)


# --- CPU and commits ------------------------------------------------------------------


def cpu_of(pid: int, children: bool = False) -> float:
    """utime + stime of ``pid`` (and of its reaped children), seconds; 0 once gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = data[data.rindex(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                data = (entry / "stat").read_text()
                if int(data[data.rindex(")") + 2 :].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def tree_cpu(pid: int | None) -> float:
    """A process, its reaped children and its live ones."""
    if pid is None:
        return 0.0
    return cpu_of(pid, children=True) + sum(cpu_of(c) for c in children_of(pid))


@dataclass
class Window:
    """What one mode's rounds cost."""

    db_cpu: float = 0.0
    server_cpu: float = 0.0
    worker_cpu: float = 0.0
    bouncer_cpu: float = 0.0
    statement_ms: float | None = None


@dataclass
class Meter:
    """Samples the database's server processes while rounds run."""

    admin: sa.Engine
    database: str
    bouncer_pid: int | None
    worker_pid: int | None = None
    source: str = "/proc: the CPU of this database's server processes"
    _postmaster: int = 0
    _statements: bool = False
    _seen: dict[int, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        with self.admin.connect() as conn:
            data_dir = conn.exec_driver_sql("SHOW data_directory").scalar_one()
            preload = conn.exec_driver_sql("SHOW shared_preload_libraries").scalar_one()
        with contextlib.suppress(OSError, ValueError):
            self._postmaster = int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
        if "pg_stat_statements" in preload:
            with self.admin.connect() as conn:
                conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self._statements = True
            self.source = "pg_stat_statements: execution time of this database's statements"

    def backends(self, conn: sa.Connection) -> list[int]:
        query = sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :db")
        return [int(pid) for pid in conn.execute(query, {"db": self.database}).scalars()]

    def statement_ms(self, conn: sa.Connection) -> float:
        query = sa.text(
            "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db"
        )
        return float(conn.execute(query, {"db": self.database}).scalar_one())

    def settled_commits(self) -> int:
        """This database's committed transactions, once every backend has
        reported them: an idle backend reports within PostgreSQL's idle
        interval (10 s), so this waits that out."""
        time.sleep(STATS_SETTLE)
        with self.admin.connect() as conn:
            query = sa.text("SELECT xact_commit FROM pg_stat_database WHERE datname = :db")
            return int(conn.execute(query, {"db": self.database}).scalar_one())

    @contextlib.contextmanager
    def window(self) -> Iterator[Window]:
        """CPU spent while the block runs."""
        got = Window()
        stop = threading.Event()
        self._seen = {}
        with self.admin.connect() as conn:
            start_ms = self.statement_ms(conn) if self._statements else None
            for pid in self.backends(conn):
                cpu = cpu_of(pid)
                self._seen[pid] = (cpu, cpu)
        server0 = tree_cpu(self._postmaster or None)
        worker0 = tree_cpu(self.worker_pid)
        bouncer0 = cpu_of(self.bouncer_pid) if self.bouncer_pid else 0.0
        sampler = threading.Thread(target=self._sample, args=(stop,), daemon=True)
        sampler.start()
        try:
            yield got
        finally:
            stop.set()
            sampler.join()
            self._sample_once()
            got.db_cpu = sum(last - first for first, last in self._seen.values())
            got.server_cpu = tree_cpu(self._postmaster or None) - server0
            got.worker_cpu = tree_cpu(self.worker_pid) - worker0
            if self.bouncer_pid:
                got.bouncer_cpu = cpu_of(self.bouncer_pid) - bouncer0
            if start_ms is not None:
                with self.admin.connect() as conn:
                    got.statement_ms = self.statement_ms(conn) - start_ms

    def _sample(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_EVERY):
            self._sample_once()

    def _sample_once(self) -> None:
        with self.admin.connect() as conn:
            pids = self.backends(conn)
        for pid in pids:
            cpu = cpu_of(pid)
            first, _ = self._seen.get(pid, (0.0, 0.0))  # new since the start: all of it
            self._seen[pid] = (first, max(cpu, self._seen.get(pid, (0.0, 0.0))[1]))


# --- the rounds -------------------------------------------------------------------


@dataclass
class Row:
    workers: int
    mode: str
    steps: int
    step_rates: list[float]
    chain_rates: list[float]
    latencies_ms: list[float]
    commits: int
    cost: Window


def measure(
    benchapp: Any,
    meter: Meter,
    poller: sa.Engine,
    workers: int,
    mode: str,
    runs: int,
    steps: int,
    rounds: int,
) -> Row:
    from celery import chain

    from pikku_celery.sql.schema import run_table

    workflow = getattr(benchapp, MODES[mode])
    inc = benchapp.inc
    step_rates: list[float] = []
    chain_rates: list[float] = []
    latencies: list[float] = []
    polls = 0
    commits0 = meter.settled_commits()
    with meter.window() as cost:
        for _ in range(rounds):
            # The plain Celery chains first (they write nothing to the database).
            t0 = time.perf_counter()
            results = [
                chain(inc.s(0), *[inc.s() for _ in range(steps - 1)]).apply_async()
                for _ in range(runs)
            ]
            assert all(r.get(timeout=300) == steps for r in results)
            chain_rates.append(runs * steps / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            ids = [workflow.start(steps).run_id for _ in range(runs)]
            settled = sa.select(sa.func.count()).where(
                run_table.c.id.in_(ids), run_table.c.status == "completed"
            )
            with poller.connect() as conn:
                while True:
                    polls += 1
                    if conn.execute(settled).scalar_one() == runs:
                        break
                    if time.perf_counter() - t0 > ROUND_TIMEOUT:
                        raise TimeoutError(f"{runs} runs not settled in {ROUND_TIMEOUT} s")
                    time.sleep(0.01)  # the poll's pace
                step_rates.append(runs * steps / (time.perf_counter() - t0))
                polls += 1
                latencies += step_latencies(conn, ids)
    commits = meter.settled_commits() - commits0 - polls
    total = steps * runs * rounds
    return Row(workers, mode, total, step_rates, chain_rates, latencies, commits, cost)


def step_latencies(conn: sa.Connection, ids: list[str]) -> list[float]:
    """Per step, the time from the previous step's outcome (the run's start
    for the first) to its own, on the database clock (ms)."""
    from pikku_celery.sql.schema import attempt_table, run_table, step_table

    a, s, r = attempt_table, step_table, run_table
    query = (
        sa.select(s.c.run_id, s.c.seq, a.c.finished_at, r.c.created_at)
        .join(a, (a.c.step_id == s.c.id) & (a.c.attempt == s.c.attempt))
        .join(r, r.c.id == s.c.run_id)
        .where(s.c.run_id.in_(ids))
        .order_by(s.c.run_id, s.c.seq)
    )
    out: list[float] = []
    previous: dict[str, int] = {}
    for run_id, _seq, finished, created in conn.execute(query):
        out.append(float(finished - previous.get(run_id, created)))
        previous[run_id] = finished
    return out


# --- the report --------------------------------------------------------------------


def per_k(seconds: float, steps: int) -> str:
    return f"{seconds * 1000 / steps:.2f}"


def report(args: argparse.Namespace, rows: list[Row], source: str) -> None:
    via = "through PgBouncer (transaction pooling)" if args.pgbouncer else "direct"
    print(
        f"\n{args.runs} concurrent {args.steps}-step runs a round, {args.rounds} rounds, "
        f"Redis broker, PostgreSQL {via}, celery worker --pool prefork -c N\n"
    )
    head = (
        "| workers | mode | steps/s (range) | chain links/s | steps/links "
        "| PG CPU s/1k steps | server CPU s/1k | worker CPU s/1k | commits/step "
        "| step p50 ms | step p99 ms |"
    )
    if args.pgbouncer:
        head += " PgBouncer CPU s/1k |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    per_vcpu: dict[str, list[float]] = {}
    for r in rows:
        rate = statistics.median(r.step_rates)
        links = statistics.median(r.chain_rates)
        q = statistics.quantiles(r.latencies_ms, n=100)
        pg = r.cost.db_cpu if r.cost.statement_ms is None else r.cost.statement_ms / 1000
        if pg > 0:
            per_vcpu.setdefault(r.mode, []).append(r.steps / pg)
        line = (
            f"| {r.workers} | {r.mode} | {rate:.0f} ({min(r.step_rates):.0f}-"
            f"{max(r.step_rates):.0f}) | {links:.0f} | {rate / links:.2f}x "
            f"| {per_k(pg, r.steps)} | {per_k(r.cost.server_cpu, r.steps)} "
            f"| {per_k(r.cost.worker_cpu, r.steps)} | {r.commits / r.steps:.2f} "
            f"| {q[49]:.0f} | {q[98]:.0f} |"
        )
        if args.pgbouncer:
            line += f" {per_k(r.cost.bouncer_cpu, r.steps)} |"
        print(line)
    print(f"\nPG CPU: {source}; server CPU: every PostgreSQL process of the machine's server")
    for mode, values in per_vcpu.items():
        print(
            f"{mode} steps: one PostgreSQL vCPU carries about {statistics.median(values):.0f} "
            f"steps/s (1,000 / PG CPU s per 1k steps; rows: "
            f"{', '.join(f'{v:.0f}' for v in values)})"
        )


if __name__ == "__main__":
    sys.exit(main())
