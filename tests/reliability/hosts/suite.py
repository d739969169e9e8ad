"""The cross-host fault suite: workers, the store and the broker on separate hosts.

The hosts are network namespaces on one bridge (:mod:`.network`): the
throwaway PostgreSQL on ``db``, the throwaway Redis broker on ``broker``, one
``celery worker`` of the chaos app (:mod:`tests.reliability.chaosapp`) on each
of ``w1`` and ``w2``; beat, the test process and a Redis of counters run in
the root namespace, on the bridge's address. Five-step workflows start
throughout the run while one fault strikes:

- ``db-cut``: a worker cut off from the store (not the broker) past its lease;
- ``broker-cut``: a worker cut off from the broker (not the store) past the
  broker's visibility timeout;
- ``db-latency``: every worker's store connection through a proxy adding
  200 ms to each round trip, for the whole run;
- ``db-drops``: the workers' store connections through a proxy that resets
  one connection in twenty mid-stream (the pool replaces connections every
  second, so there are many);
- ``partition``: a worker's link down until its lease lapsed and another
  worker took its steps over, then up again; its late outcome must be refused.

Then every run must end, and the chaos suite's checks hold (every ledger row
exactly once, by its step's final attempt; no stale outcome recorded; no
attempt's body run twice). Each run gives one row of the summary table.

    python -m tests.reliability.hosts.suite --case partition --runs 200 --minutes 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
import sqlalchemy as sa

from pikku_celery.sql.schema import attempt_table, metadata, run_table, step_table
from pikku_celery.testing.nodes import LocalRedisContainer
from tests.celery.workers import WorkerProcess, worker
from tests.helpers import wait_until
from tests.throwaway import ThrowawayPostgres, ThrowawayRedis, throwaway_postgres, throwaway_redis

from .. import chaosapp
from ..chaos import (
    APP_MODULE,
    REFUSED,
    TERMINAL,
    ChaosConfig,
    ChaosSummary,
    ChaosWorkerContainer,
    Echo,
    _Chaos,
    chaos_beat,
    chaos_env,
)
from .network import BRIDGE_ADDRESS, Host, topology
from .proxy import FaultProxy

CASES = {
    "db-cut": "worker cut off from the store, not the broker",
    "broker-cut": "worker cut off from the broker, not the store",
    "db-latency": "200 ms round trip to the store",
    "db-drops": "5 % of store connections reset mid-stream",
    "partition": "worker partitioned past its lease, then healed",
}
CUTS = ("db-cut", "broker-cut", "partition")
TAKEN_OVER = ("db-cut", "partition")  # the cut-off worker's steps must move
LONG_ENV = "PIKKU_FAULT_SUITE_LONG"


@dataclass
class HostsConfig:
    case: str
    runs: int = 16
    seconds: float = 24.0  # runs start evenly over this window
    faults: int = 1  # cut cases: how many cuts (alternating workers)
    first_fault: float = 3.0  # seconds into the window
    fault_every: float = 15.0  # seconds between two cuts' starts (the long form)
    max_hold: float = 45.0  # a cut waiting for the takeover ends by then
    visibility: float = 3.0  # broker visibility timeout, so the step lease
    sweep: float = 1.0
    concurrency: int = 2
    delay: float = 0.1  # db-latency: one way, so the round trip is twice this
    drop_every: int = 20  # db-drops: one connection in this many
    pool_recycle: float = 1.0  # db-drops: a pooled connection lives this long
    settle_timeout: float = 120.0
    seed: int | None = None
    workdir: Path | None = None

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"case must be one of {sorted(CASES)}, not {self.case!r}")

    @property
    def min_hold(self) -> float:
        """A cut lasts longer than the lease, and the sweep has had its turns."""
        return self.visibility * 2 + self.sweep * 2


@dataclass
class Fault:
    """One fault: which worker slot, when (monotonic); ``kind`` a ``cut`` or a
    proxy's ``reset`` of one connection."""

    slot: int | None
    began: float
    kind: str = "cut"
    ended: float | None = None
    held: int = 0  # steps the worker was running when cut off
    recovered: float | None = None  # seconds from the end until it finished a step again


@dataclass
class HostsSummary:
    """One row of the suite's table."""

    case: str
    runs: int = 0
    completed: int = 0
    faults: int = 0
    fault_note: str = ""
    ledger_rows: int = 0
    steps: int = 0
    refused: int = 0  # stale outcomes refused ("refused a superseded" lines)
    superseded: int = 0  # attempt rows superseded
    held: int = 0  # steps running on cut-off workers when they were cut
    max_recover: float | None = None
    longest_stall: float = 0.0
    wall: float = 0.0
    violations: list[str] = field(default_factory=list)
    chaos: ChaosSummary | None = None

    def cells(self) -> list[str]:
        recover = "-" if self.max_recover is None else f"{self.max_recover:.1f} s"
        return [
            self.case,
            f"{self.completed}/{self.runs}",
            f"{self.faults} {self.fault_note}",
            str(self.ledger_rows),
            f"{self.refused} ({self.superseded} superseded rows)",
            recover,
            f"{self.longest_stall:.1f} s",
            f"{self.wall:.0f} s",
            str(len(self.violations)),
        ]


COLUMNS = [
    "case",
    "runs completed",
    "faults injected",
    "ledger rows",
    "stale outcomes refused",
    "max time to recover",
    "longest stall",
    "wall",
    "violations",
]


def render_table(rows: Sequence[HostsSummary]) -> str:
    """The summary table, Markdown."""
    body = [r.cells() for r in rows]
    widths = [max(len(c) for c in column) for column in zip(COLUMNS, *body, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(COLUMNS), rule, *(line(cells) for cells in body)])


# --- the lab: hosts and servers, shared by the cases ----------------------------


@dataclass
class Lab:
    db: Host
    broker: Host
    workers: list[Host]
    postgres: ThrowawayPostgres
    broker_redis: ThrowawayRedis
    counters: ThrowawayRedis  # root namespace, on the bridge's address


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    """The hosts and their servers; everything removed afterwards."""
    with topology(["db", "broker", "w1", "w2"]) as hosts:
        db, broker = hosts["db"], hosts["broker"]
        with (
            throwaway_postgres(db.address, db.exec_prefix) as postgres,
            throwaway_redis(broker.address, broker.exec_prefix) as broker_redis,
            throwaway_redis(BRIDGE_ADDRESS) as counters,
        ):
            yield Lab(db, broker, [hosts["w1"], hosts["w2"]], postgres, broker_redis, counters)


# --- one run --------------------------------------------------------------------


class _FaultRun(_Chaos):
    """A chaos run without the killer: its workers on hosts, one case's faults."""

    def __init__(self, lab: Lab, cfg: HostsConfig, echo: Echo) -> None:
        super().__init__(
            ChaosConfig(
                runs=cfg.runs,
                seconds=cfg.seconds,
                workers=len(lab.workers),
                concurrency=cfg.concurrency,
                flush_broker=False,
                restart_postgres=False,
                visibility=cfg.visibility,
                sweep=cfg.sweep,
                settle_timeout=cfg.settle_timeout,
                seed=cfg.seed,
                workdir=cfg.workdir,
            ),
            echo,
        )
        self.lab = lab
        self.hcfg = cfg
        self.tag = f"hosts_{cfg.case.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
        self.broker = LocalRedisContainer(lab.broker_redis.url, prefix=f"{self.tag}:")
        self.row = HostsSummary(case=cfg.case, runs=cfg.runs)
        self.faults: list[Fault] = []
        self.proxy: FaultProxy | None = None
        self.monitor = _Monitor(self)

    # --- processes ---------------------------------------------------------
    def spawn(self, slot: int) -> WorkerProcess:
        self.incarnations += 1
        name = f"w{slot + 1}-{self.incarnations}"
        proc = worker(
            self.worker_env,
            [self.app.queue],
            self.workdir / f"{name}.log",
            f"{name}-{self.tag}",
            self.cfg.concurrency,
            app_module=APP_MODULE,
            container_cls=ChaosWorkerContainer,
            skew=False,
            command_prefix=self.lab.workers[slot].exec_prefix,
        )
        self.summary.worker_starts += 1
        return proc

    # --- the whole thing -----------------------------------------------------
    def run(self) -> ChaosSummary:
        url = self.lab.postgres.database_url(self.tag)
        setup = sa.create_engine(url, poolclass=sa.pool.NullPool)
        metadata.create_all(setup)
        chaosapp.ledger.create(setup)
        setup.dispose()
        self.env = chaos_env(self.tag, url, self.broker, self.cfg.visibility, self.cfg.sweep)
        self.env["PIKKU_CHAOS_COUNTER"] = self.lab.counters.url
        self.worker_env = dict(self.env)
        case = self.hcfg.case
        if case in ("db-latency", "db-drops"):
            self.proxy = FaultProxy(
                BRIDGE_ADDRESS,
                (self.lab.db.address, self.lab.postgres.port),
                delay=self.hcfg.delay if case == "db-latency" else 0.0,
                drop_every=self.hcfg.drop_every if case == "db-drops" else 0,
                seed=self.cfg.seed,
                lifetime=self.cfg.seconds + self.cfg.settle_timeout + 600,
            ).start()
            proxied = sa.engine.make_url(url).set(host=BRIDGE_ADDRESS, port=self.proxy.port)
            self.worker_env["PIKKU_CHAOS_DATABASE"] = proxied.render_as_string(False)
            if case == "db-drops":
                self.worker_env["PIKKU_CHAOS_POOL_RECYCLE"] = str(self.hcfg.pool_recycle)
        self.app = chaosapp.build(self.env)
        assert self.app.pikku.sql_engine is not None
        self.engine = self.app.pikku.sql_engine
        self.counter = redis.Redis.from_url(self.lab.counters.url)
        try:
            self._run()
            self._check()
        finally:
            self.monitor.stop()
            for host in self.lab.workers:
                with contextlib.suppress(RuntimeError):
                    host.heal()
                with contextlib.suppress(RuntimeError):
                    host.plug()
            self._teardown()
            if self.proxy is not None:
                self.proxy.stop()
        self.summary.wall_seconds = time.monotonic() - self.t0
        return self.summary

    def _run(self) -> None:
        cfg = self.cfg
        self.beat = chaos_beat(self.env, self.workdir)  # the root namespace
        self.slots = [self.spawn(slot) for slot in range(cfg.workers)]
        for slot, proc in enumerate(self.slots):
            try:
                proc.wait_ready(timeout=60)
            except AssertionError:
                self.slots[slot] = self.start_worker(slot, time.monotonic() + 60)
        self.beat.wait_ready(timeout=60)
        self.log(f"{cfg.workers} workers on hosts and beat up; workdir {self.workdir}")
        self.monitor.start()
        times = self.schedule(cfg.seconds, [])
        starter = threading.Thread(target=self.starter, args=(times,), daemon=True)
        began = time.monotonic()
        starter.start()
        striker: threading.Thread | None = None
        if self.hcfg.case in CUTS:
            striker = threading.Thread(target=self.cuts, args=(began,), daemon=True)
            striker.start()
        try:
            self.stop.wait(max(0.0, began + cfg.seconds - time.monotonic()))  # the window
            if striker is not None:
                striker.join(timeout=self.hcfg.max_hold * (self.hcfg.faults + 1) + 60)
        finally:
            self.stop.set()
            starter.join(timeout=120)
        end = time.monotonic()
        self.summary.chaos_seconds = end - began
        self.log(f"{self.summary.runs_started} runs started; waiting for all to end")
        try:
            wait_until(lambda: self.unsettled() == 0, timeout=cfg.settle_timeout, interval=0.2)
        except AssertionError:
            self.summary.violations.append(
                f"{self.unsettled()} runs had not ended {cfg.settle_timeout:.0f} s after the window"
            )
            self._dump_store()
        self.summary.settle_seconds = time.monotonic() - end
        self.log(f"settled {self.summary.settle_seconds:.1f} s after the window")
        self._await_recovery()

    def _dump_store(self) -> None:
        """The steps and attempts of every run not ended, into the workdir."""
        with self.engine.connect() as conn:
            open_runs = sa.select(run_table.c.id).where(run_table.c.status.not_in(TERMINAL))
            steps = conn.execute(
                sa.select(step_table).where(step_table.c.run_id.in_(open_runs))
            ).all()
            attempts = conn.execute(
                sa.select(attempt_table).where(attempt_table.c.run_id.in_(open_runs))
            ).all()
        lines = [f"step {r._mapping}" for r in steps] + [f"attempt {r._mapping}" for r in attempts]
        (self.workdir / "store-dump.txt").write_text("\n".join(lines) + "\n")

    # --- the cuts ----------------------------------------------------------------
    def cuts(self, began: float) -> None:
        try:
            for k in range(self.hcfg.faults):
                at = began + self.hcfg.first_fault + k * self.hcfg.fault_every
                if self.abort.wait(max(0.0, at - time.monotonic())):  # the fault's time
                    return
                self.cut(k % len(self.slots))  # or the busy worker, if that one is idle
        except Exception as exc:  # recorded: the run fails
            self.errors.append(f"cut: {exc!r}")

    def held_by(self, slot: int) -> dict[str, int]:
        """Steps running on the worker in ``slot``: step id -> attempt."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(step_table.c.id, step_table.c.attempt, step_table.c.worker).where(
                    step_table.c.status == "running"
                )
            ).all()
        return {r.id: r.attempt for r in rows if self.monitor.slot_of(r.worker) == slot}

    def busy_slot(self, preferred: int) -> int | None:
        """``preferred`` if its worker runs a step now, else another busy worker's
        slot: eager steps keep a run on the worker that took it, so one worker
        can stay idle for a whole short workload."""
        busy = self.busy_slots()
        if preferred in busy:
            return preferred
        return busy[0] if busy else None

    def cut(self, preferred: int) -> None:
        """Cut a worker off while it runs a step (the one in ``preferred`` if it
        is busy), until its lease lapsed (and its steps were taken over), then
        heal it."""
        case = self.hcfg.case
        slot = preferred
        for tries in range(40):  # until the cut catches it holding a step
            while (found := self.busy_slot(preferred)) is None and not self.abort.wait(0.05):
                if time.monotonic() - self.t0 > self.cfg.seconds * 2:
                    break  # the workload is over: cut it anyway
            slot = preferred if found is None else found
            host = self.lab.workers[slot]
            began = time.monotonic()
            if case == "db-cut":
                host.cut_from(self.lab.db)
            elif case == "broker-cut":
                host.cut_from(self.lab.broker)
            else:
                host.unplug()
            held = self.held_by(slot)
            if held or tries == 39:
                break
            host.heal()  # it finished its step just before the cut: again
            host.plug()
        fault = Fault(slot, began, held=len(held))
        self.faults.append(fault)
        self.log(f"{case}: w{slot + 1} cut off, holding {len(held)} steps")
        self.abort.wait(self.hcfg.min_hold)  # longer than the lease
        if case in TAKEN_OVER and held:
            try:
                wait_until(
                    lambda: self._taken_over(held),
                    timeout=max(1.0, began + self.hcfg.max_hold - time.monotonic()),
                    interval=0.2,
                )
            except AssertionError:
                self.errors.append(
                    f"{case}: the steps w{slot + 1} held were not taken over"
                    f" within {self.hcfg.max_hold:.0f} s"
                )
        host.heal()
        host.plug()
        fault.ended = time.monotonic()
        self.log(f"{case}: w{slot + 1} healed after {fault.ended - began:.1f} s")

    def _taken_over(self, held: dict[str, int]) -> bool:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(step_table.c.id, step_table.c.attempt, step_table.c.status).where(
                    step_table.c.id.in_(list(held))
                )
            ).all()
        return all(r.attempt > held[r.id] or r.status == "succeeded" for r in rows)

    def _await_recovery(self) -> None:
        """Measure how long each faulted worker took to finish a step again; a
        cut-off worker that never did breaks the run, and so does a worker cut
        off while running a step whose late outcome never came back refused."""
        self.faults += self._drops()
        for fault in self.faults:
            if fault.slot is None or fault.ended is None:
                continue
            fault.recovered = self.monitor.finished_after(fault.slot, fault.ended)
            if fault.recovered is None and fault.kind == "cut":
                # The workload may have ended before the healed worker was back
                # on its broker (a reconnect waits out TCP's back-off): give it
                # more work, for a bounded time, before calling it stuck.
                fault.recovered = self._probe(fault.slot, fault.ended)
            if fault.recovered is None and fault.kind == "cut":
                self.summary.violations.append(
                    f"w{fault.slot + 1} finished no step after its cut ended"
                )
        if self.hcfg.case in TAKEN_OVER and any(f.held > 0 for f in self.faults):
            try:
                wait_until(lambda: self._refused_lines() > 0, timeout=60, interval=0.2)
            except AssertionError:
                self.summary.violations.append(
                    "a worker cut off while running a step never had its late outcome refused"
                )

    def _probe(self, slot: int, moment: float, within: float = 90.0) -> float | None:
        """Start more runs until the worker in ``slot`` finishes a step after
        ``moment`` (the seconds that took), or ``within`` seconds pass (None)."""
        deadline = time.monotonic() + within
        index = max(self.run_ids, default=-1) + 1
        while time.monotonic() < deadline:
            for i in range(index, index + self.cfg.workers * 2):
                self.run_ids[i] = self.app.workflow.start(i, idempotency_key=f"chaos-{i}").run_id
            index += self.cfg.workers * 2
            self.summary.runs_started = len(self.run_ids)
            with contextlib.suppress(AssertionError):  # the probes' own pace
                wait_until(lambda: self.unsettled() == 0, timeout=30, interval=0.2)
            found = self.monitor.finished_after(slot, moment)
            if found is not None:
                return found
        return None

    def _refused_lines(self) -> int:
        return sum(
            len(REFUSED.findall(p.read_text(errors="replace"))) for p in self.workdir.glob("w*.log")
        )

    def _drops(self) -> list[Fault]:
        """The proxy's resets, as faults of the worker whose connection it was
        (only measured: the workload may have ended just after one)."""
        if self.proxy is None:
            return []
        addresses = {h.address: i for i, h in enumerate(self.lab.workers)}
        return [
            Fault(addresses.get(d.client), d.at, kind="reset", ended=d.at)
            for d in self.proxy.stats.drops
        ]

    # --- the row -----------------------------------------------------------------
    def summarise(self) -> HostsSummary:
        s, row = self.summary, self.row
        row.chaos = s
        row.runs = max(row.runs, s.runs_started)  # with any probes of a healed worker
        row.completed = s.completed
        row.steps = s.steps
        row.ledger_rows = s.ledger_rows
        row.refused = s.refused_logged
        row.superseded = s.superseded_attempts
        row.wall = s.wall_seconds
        row.longest_stall = self.monitor.longest_stall
        row.violations = list(s.violations)
        recovered = [f.recovered for f in self.faults if f.recovered is not None]
        row.max_recover = max(recovered) if recovered else None
        row.held = sum(f.held for f in self.faults)
        if self.hcfg.case == "db-latency":
            assert self.proxy is not None
            row.faults = self.proxy.stats.connections
            trips = self.proxy.stats.replies / max(1, self.summary.steps)
            row.fault_note = (
                f"conns at +{self.hcfg.delay * 2000:.0f} ms RTT (~{trips:.0f} round trips a step)"
            )
        elif self.hcfg.case == "db-drops":
            assert self.proxy is not None
            row.faults = len(self.proxy.stats.drops)
            row.fault_note = f"of {self.proxy.stats.connections} conns reset"
        else:
            row.faults = len(self.faults)
            lengths = [f.ended - f.began for f in self.faults if f.ended is not None]
            longest = max(lengths, default=0.0)
            row.fault_note = f"cuts ({row.held} steps held, <={longest:.0f} s)"
        return row


class _Monitor:
    """Samples the store a few times a second: which worker finished how many
    attempts when, and the longest time no step finished while runs were open."""

    def __init__(self, run: _FaultRun) -> None:
        self.run = run
        self.slots: dict[str, int | None] = {}  # attempt.worker -> slot
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.longest_stall = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hosts-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def slot_of(self, worker_id: str | None) -> int | None:
        """The slot whose worker's process group the pool process is in."""
        if not worker_id:
            return None
        if worker_id not in self.slots:
            try:
                group = os.getpgid(int(worker_id.rsplit(":", 1)[1]))
            except (ProcessLookupError, ValueError):
                return None
            groups = {p.pid: i for i, p in enumerate(self.run.slots)}
            self.slots[worker_id] = groups.get(group)
        return self.slots[worker_id]

    def finished_after(self, slot: int, moment: float) -> float | None:
        """Seconds from ``moment`` until the worker in ``slot`` had finished one more attempt."""
        before = next((c.get(slot, 0) for t, c in reversed(self.samples) if t <= moment), 0)
        for t, counts in self.samples:
            if t > moment and counts.get(slot, 0) > before:
                return t - moment
        return None

    def _loop(self) -> None:
        last_change, last_total = time.monotonic(), -1
        while not self._stop.wait(0.25):  # the sampling rate
            try:
                with self.run.engine.connect() as conn:
                    done = conn.execute(
                        sa.select(attempt_table.c.worker, sa.func.count())
                        .where(attempt_table.c.status == "succeeded")
                        .group_by(attempt_table.c.worker)
                    ).all()
                    open_runs = conn.execute(
                        sa.select(sa.func.count()).where(run_table.c.status.not_in(TERMINAL))
                    ).scalar_one()
            except sa.exc.OperationalError:
                continue
            now = time.monotonic()
            counts: dict[int, int] = {}
            for worker_id, n in done:
                slot = self.slot_of(worker_id)
                if slot is not None:
                    counts[slot] = counts.get(slot, 0) + int(n)
            self.samples.append((now, counts))
            total = sum(int(n) for _, n in done)
            if total != last_total or not open_runs:
                last_change, last_total = now, total
            self.longest_stall = max(self.longest_stall, now - last_change)


def run_case(lab_: Lab, cfg: HostsConfig, echo: Echo = print, check: bool = True) -> HostsSummary:
    """Run one case on ``lab_`` and return its row; with ``check`` an
    :class:`AssertionError` lists every violation (logs kept then)."""
    run = _FaultRun(lab_, cfg, echo)
    try:
        run.run()
    finally:
        row = run.summarise()
        if row.violations:
            echo(run.log_tails())
    c = run.summary
    echo(
        f"{cfg.case}: runs {c.statuses}, {c.steps} steps, attempts {c.attempt_statuses},"
        f" bodies run again {c.reexecutions}, {len(row.violations)} violations"
    )
    for violation in row.violations[:40]:
        echo(f"  - {violation}")
    echo(render_table([row]))
    if not row.violations:
        shutil.rmtree(run.workdir, ignore_errors=True)
    if check and row.violations:
        head = "\n".join(f"- {x}" for x in row.violations[:40])
        raise AssertionError(
            f"{cfg.case} broke {len(row.violations)} invariant(s):\n{head}\n\n"
            f"{render_table([row])}\n\nlogs: {run.workdir}"
        )
    return row


def short_config(case: str) -> HostsConfig:
    """The short form (CI): one fault, a few runs. Every store round trip
    200 ms long makes a step cost seconds (it takes tens of them), so that
    case runs fewer workflows on more pool processes."""
    if case == "db-latency":
        return HostsConfig(case=case, runs=6, seconds=10.0, concurrency=3)
    return HostsConfig(case=case)


def long_config(case: str, runs: int = 200, minutes: float = 5.0) -> HostsConfig:
    """The long form: many runs, and a cut every ``fault_every`` seconds (the
    latency case a quarter of the runs, on more pool processes: see
    :func:`short_config`)."""
    seconds = minutes * 60
    if case == "db-latency":
        return HostsConfig(
            case=case, runs=max(1, runs // 4), seconds=seconds, concurrency=4, settle_timeout=600
        )
    cfg = HostsConfig(case=case, runs=runs, seconds=seconds, settle_timeout=300.0)
    cfg.faults = max(1, int((seconds - cfg.first_fault - cfg.max_hold) // cfg.fault_every))
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=5.0)
    args = parser.parse_args(argv)
    # Stop cleanly (hosts, servers and workers removed) on SIGTERM, and on
    # SIGINT even when started in the background, where it is ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[HostsSummary] = []
    echo: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731
    with lab() as lab_:
        for case in args.case or list(CASES):
            rows.append(run_case(lab_, long_config(case, args.runs, args.minutes), echo, False))
    print(render_table(rows), flush=True)
    return 1 if any(r.violations for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
