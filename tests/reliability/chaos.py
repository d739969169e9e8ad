"""The chaos suite: many workflows on real workers while everything breaks.

N five-step workflows (:mod:`tests.reliability.chaosapp`) run on a Redis
broker node (a key prefix of its own) and a PostgreSQL store (a throwaway
server of the run's own, :mod:`tests.throwaway`: the run crashes it) with several
``celery worker`` nodes and a ``celery beat`` (pikku's local pytest-celery
nodes, :mod:`tests.celery.workers`). For the length of the chaos window a
killer SIGKILLs a worker's process group every few seconds and starts a
replacement (half the kills go to a worker that is running a step); a quarter
of its turns instead freeze a busy worker (SIGSTOP) past its lease and then
let it go on, so a superseded attempt really reaches its fenced write. Once in the window the
broker is flushed (every key of the run's Redis broker node: every queued and
unacked message lost) and once PostgreSQL is restarted, each just after a
burst of new runs. Then the killing stops and every run must settle within a
deadline. The checks, from the store, the ledger, the Redis counters and the
workers' logs:

- every run completed;
- every step has exactly one ledger row, written by its final attempt;
- every recorded step result was written by its step's final attempt;
- no attempt's body ran twice (but an attempt whose asynchronous claim the
  PostgreSQL crash lost, at most one per step running then, and a
  transactional step whose transaction the crash lost, which its worker took
  again as its log says), and no step's body ran more often than it was
  claimed;
- how many superseded writes were refused, and how many times the
  at-least-once bodies ran again (the non-transactional counter).

With ``skew_worker`` one worker slot (the replacements in that slot too) runs
under ``faketime -f +1h``: its wall clock is an hour fast throughout.

    python -m tests.reliability.chaos --runs 200 --minutes 10 [--skew-worker]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from pikku_celery.sql.schema import attempt_table, metadata, run_table, step_table
from pikku_celery.testing.nodes import LocalRedisContainer, LocalWorkerContainer
from tests.celery.workers import BeatProcess, WorkerProcess, beat, worker
from tests.helpers import wait_until
from tests.services import REDIS_URL, SESSION_TAG
from tests.throwaway import ThrowawayPostgres, throwaway_postgres

from . import chaosapp

ROOT = Path(__file__).resolve().parents[2]
APP_MODULE = "tests.reliability.chaosapp"
LAUNCHER = "tests.reliability.launch"
SKEW = "+1h"
SKEW_SECONDS = 3600.0
CLOCK_TOLERANCE = 120.0  # seconds: what "an hour fast" and "on time" allow
REFUSED = re.compile(r"refused a superseded")
# A transactional step whose transaction the store lost runs again in its attempt.
TAKEN_AGAIN = re.compile(r"running transactional step (\S+:\S+:\d+); taking it again")
DISCARDED = re.compile(r"Discarding revoked task")
TERMINAL = ("completed", "failed", "cancelled")

Echo = Callable[[str], None]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- processes -----------------------------------------------------------------

SKEW_ENV = {"FAKETIME_DONT_FAKE_MONOTONIC": "1", "PIKKU_CHAOS_SLEEP_SHIM": "1"}
"""What a Python process under faketime needs (see :mod:`tests.reliability.launch`)."""


def skewed(argv: list[str]) -> list[str]:
    """``argv`` with its wall clock an hour fast: run it with :data:`SKEW_ENV`."""
    return ["faketime", "-f", SKEW, *argv]


class ChaosWorkerContainer(LocalWorkerContainer):
    """A worker of the chaos app, optionally with its clock an hour fast.

    Started through :mod:`tests.reliability.launch`; a skewed one as
    ``faketime -f +1h python -m tests.reliability.launch ...`` with
    ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (a faked monotonic clock hangs Python's
    timed lock waits) and the launcher's sleep shim (that mode breaks
    ``time.sleep``): see :mod:`tests.reliability.launch`.
    """

    def __init__(self, *args: Any, skew: bool = False, **options: Any) -> None:
        self.skewed = skew
        extra = {"PIKKU_CHAOS_SKEWED": "1" if skew else "0"} | (SKEW_ENV if skew else {})
        options["env"] = {**options.get("env", {}), **extra}
        if skew:
            options["command_prefix"] = ["faketime", "-f", SKEW]
        super().__init__(*args, python_module=LAUNCHER, **options)

    def _after_exit(self) -> None:
        """faketime keeps a shared-memory segment and a semaphore per wrapper
        pid and removes them only on a clean exit; a stale pair breaks the
        next faketime that gets the same pid."""
        pid = self.pid
        if not self.skewed or pid is None or self.process.running:
            return
        for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
            Path("/dev/shm", name).unlink(missing_ok=True)


def chaos_worker(
    env: Mapping[str, str], queue: str, log: Path, name: str, concurrency: int, skew: bool = False
) -> WorkerProcess:
    """Start a worker node of the chaos app on ``queue``."""
    return worker(
        env,
        [queue],
        log,
        name,
        concurrency,
        app_module=APP_MODULE,
        container_cls=ChaosWorkerContainer,
        skew=skew,
    )


def chaos_beat(env: Mapping[str, str], workdir: Path) -> BeatProcess:
    """Start beat of the chaos app (its log and schedule in ``workdir``)."""
    return beat(
        {**env, "PIKKU_CHAOS_SKEWED": "0"}, workdir, app_module=APP_MODULE, python_module=LAUNCHER
    )


def chaos_env(
    tag: str,
    database_url: str,
    broker: LocalRedisContainer,
    visibility: float = 3.0,
    sweep: float = 1.0,
) -> dict[str, str]:
    """The settings of :mod:`tests.reliability.chaosapp` for one chaos run on ``broker``."""
    return {
        "PIKKU_CHAOS_BROKER": broker.url,
        "PIKKU_CHAOS_KEYPREFIX": broker.prefix,
        "PIKKU_CHAOS_DATABASE": database_url,
        "PIKKU_CHAOS_QUEUE": tag,
        "PIKKU_CHAOS_COUNTER": REDIS_URL,
        "PIKKU_CHAOS_NS": tag,
        "PIKKU_CHAOS_VISIBILITY": str(visibility),
        "PIKKU_CHAOS_SWEEP": str(sweep),
    }


# --- configuration and results -------------------------------------------------


@dataclass
class ChaosConfig:
    runs: int = 40
    seconds: float = 40.0  # the chaos window: runs start, workers die, faults happen
    kill_every: float = 3.0  # mean seconds between two kills
    pause_share: float = 0.25  # of the killer's turns: SIGSTOP a worker past its lease instead
    workers: int = 3
    concurrency: int = 2
    skew_worker: bool = False
    flush_broker: bool = True
    restart_postgres: bool = True
    visibility: float = 3.0  # the Redis visibility timeout, so the step lease
    sweep: float = 1.0
    settle_timeout: float = 120.0  # after the window: every run must end by then
    broker_db: int = 11  # the broker node's prefix is flushed, not the database
    seed: int | None = None
    keep_logs: bool = False
    workdir: Path | None = None  # where the logs go (a new folder inside); default: tmp


@dataclass
class ChaosSummary:
    runs: int
    runs_started: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    attempts: int = 0
    attempt_statuses: dict[str, int] = field(default_factory=dict)
    max_attempt: int = 0
    ledger_rows: int = 0
    refused_logged: int = 0  # "refused a superseded ..." lines in worker logs
    superseded_attempts: int = 0  # attempt rows with status 'superseded'
    executions: int = 0  # sum of the non-transactional counters
    reexecutions: int = 0  # executions - steps: at-least-once runs seen by Redis
    kills: int = 0
    pauses: int = 0  # SIGSTOP past the lease, then SIGCONT: the stale attempt wakes up
    worker_starts: int = 0
    failed_worker_starts: int = 0
    flushed_broker: bool = False
    steps_running_at_flush: int = 0
    restarted_postgres: bool = False
    steps_running_at_restart: int = 0
    lost_claims: int = 0  # attempts run twice: their first claim lost in the PostgreSQL crash
    taken_again: int = 0  # transactions the store lost, taken again in their attempt
    postgres_restart_seconds: float = 0.0
    skewed_worker: bool = False
    skewed_processes: int = 0
    skew_seconds: float | None = None  # measured: skewed wall clock - Redis's
    skewed_attempts: int = 0  # attempt rows claimed by a skewed process
    skewed_ledger_rows: int = 0  # committed steps whose worker clock was an hour fast
    sweeps_discarded: int = 0  # sweep messages a worker dropped as expired
    chaos_seconds: float = 0.0
    settle_seconds: float = 0.0
    wall_seconds: float = 0.0
    workdir: str = ""
    violations: list[str] = field(default_factory=list)

    @property
    def completed(self) -> int:
        return self.statuses.get("completed", 0)

    def render(self) -> str:
        lines = [
            f"chaos run{' (one worker an hour fast)' if self.skewed_worker else ''}",
            f"  runs completed           {self.completed}/{self.runs}"
            f" (started {self.runs_started}; statuses {self.statuses})",
            f"  steps                    {self.steps}, attempts {self.attempts}"
            f" {self.attempt_statuses}, highest attempt {self.max_attempt}",
            f"  ledger rows              {self.ledger_rows}"
            f" ({'SEE VIOLATIONS' if self.violations else 'one per step, by its final attempt'})",
            f"  superseded refused       {self.refused_logged} logged refusals,"
            f" {self.superseded_attempts} superseded attempt rows",
            f"  at-least-once re-runs    {self.reexecutions}"
            f" ({self.lost_claims} claims lost in the PostgreSQL crash,"
            f" {self.taken_again} lost transactions taken again)"
            f" (counter sum {self.executions} - {self.steps} steps)",
            f"  faults                   {self.kills} SIGKILLs, {self.pauses} pauses"
            f" ({self.worker_starts} worker starts, {self.failed_worker_starts} failed to start);"
            f" broker flushed {'yes' if self.flushed_broker else 'NO'}"
            f" ({self.steps_running_at_flush} steps running);"
            f" PostgreSQL restart {'yes' if self.restarted_postgres else 'NO'}"
            f" ({self.postgres_restart_seconds:.1f} s,"
            f" {self.steps_running_at_restart} steps running)",
        ]
        if self.skewed_worker:
            skew = "?" if self.skew_seconds is None else f"{self.skew_seconds:+.1f} s"
            lines.append(
                f"  skewed worker            {self.skewed_processes} processes, clock {skew};"
                f" {self.skewed_attempts} attempts claimed, {self.skewed_ledger_rows}"
                f" steps committed; {self.sweeps_discarded} sweep messages discarded as expired"
            )
        lines += [
            f"  wall time                {self.wall_seconds:.1f} s (chaos window"
            f" {self.chaos_seconds:.1f} s, settled {self.settle_seconds:.1f} s after it)",
            f"  violations               {len(self.violations)}",
        ]
        lines += [f"    - {v}" for v in self.violations[:40]]
        if len(self.violations) > 40:
            lines.append(f"    ... and {len(self.violations) - 40} more")
        return "\n".join(lines)


# --- the run ---------------------------------------------------------------------


class _Chaos:
    def __init__(self, cfg: ChaosConfig, echo: Echo) -> None:
        self.cfg = cfg
        self.echo = echo
        self.rng = random.Random(cfg.seed)
        self.tag = f"{SESSION_TAG}_chaos{uuid.uuid4().hex[:6]}"
        if cfg.workdir is not None:
            cfg.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="pikku-chaos-", dir=cfg.workdir))
        self.summary = ChaosSummary(runs=cfg.runs, skewed_worker=cfg.skew_worker)
        self.summary.workdir = str(self.workdir)
        self.broker = LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + f"/{cfg.broker_db}")
        self.stop = threading.Event()  # the chaos window is over: no more kills
        self.abort = threading.Event()  # tearing down: the workload stops too
        self.slots: list[WorkerProcess] = []
        self.retired: list[WorkerProcess] = []
        self.incarnations = 0
        self.beat: BeatProcess | None = None
        self.run_ids: dict[int, str] = {}
        self.errors: list[str] = []
        self.t0 = time.monotonic()

    def log(self, msg: str) -> None:
        self.echo(f"[chaos {time.monotonic() - self.t0:6.1f}s] {msg}")

    # --- processes ---------------------------------------------------------
    def spawn(self, slot: int) -> WorkerProcess:
        self.incarnations += 1
        name = f"w{slot}-{self.incarnations}"
        self.workdir.mkdir(parents=True, exist_ok=True)  # in case /tmp was swept
        proc = chaos_worker(
            self.env,
            self.app.queue,
            self.workdir / f"{name}.log",
            f"{name}-{self.tag}",
            self.cfg.concurrency,
            skew=self.cfg.skew_worker and slot == 0,
        )
        self.summary.worker_starts += 1
        return proc

    def start_worker(self, slot: int, deadline: float) -> WorkerProcess:
        """Start a worker in ``slot``, again if it dies on the way up (it cannot
        while PostgreSQL restarts: building the app checks the schema)."""
        while True:
            proc = self.spawn(slot)
            try:
                proc.wait_ready(timeout=max(1.0, min(60.0, deadline - time.monotonic())))
                return proc
            except AssertionError as exc:
                proc.kill()
                self.retired.append(proc)
                self.summary.failed_worker_starts += 1
                if time.monotonic() >= deadline:
                    raise AssertionError(f"worker slot {slot} never came up: {exc}") from exc
                self.log(f"worker {proc.log_path.stem} failed to start; starting another")
                self.stop.wait(0.5)  # a restart's cadence, not synchronisation

    def pause(self, victim: WorkerProcess) -> None:
        """Freeze a worker (its lease keeper too) until its leases lapse and
        another worker takes its steps over; then let it finish what it held.
        The killer goes on meanwhile (it may kill the frozen worker too)."""
        seconds = self.cfg.visibility * 1.5 + 1
        if victim.container.status != "running":
            return  # it died by itself: the next strike replaces it
        victim.kill("SIGSTOP", reload_container=False)
        self.summary.pauses += 1
        self.log(f"SIGSTOP {victim.log_path.stem} for {seconds:.1f} s")

        def resume() -> None:
            # Only while not reaped (the node checks), so the group id is still its own.
            victim.kill("SIGCONT", reload_container=False)

        timer = threading.Timer(seconds, resume)  # the fault's length
        timer.daemon = True
        timer.start()

    def busy_slots(self) -> list[int]:
        """Worker slots whose process group runs a step right now."""
        try:
            with self.engine.connect() as conn:
                holders = conn.execute(
                    sa.select(step_table.c.worker).where(step_table.c.status == "running")
                ).scalars()
                pids = {int(w.rsplit(":", 1)[1]) for w in holders if w}
        except sa.exc.OperationalError:
            return []
        groups = set()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(pid))
        return [i for i, p in enumerate(self.slots) if p.pid in groups]

    def killer(self) -> None:
        """Every few seconds, a fault on a worker: half the kills and every
        pause go to a worker that is running a step, if any is."""
        while not self.stop.wait(self.cfg.kill_every * self.rng.uniform(0.5, 1.5)):
            try:
                self.strike()
            except Exception as exc:  # recorded (the run fails), and the killing goes on
                self.errors.append(f"killer: {exc!r}")
                self.log(f"killer: {traceback.format_exc()}")

    def strike(self) -> None:
        pausing = self.rng.random() < self.cfg.pause_share
        busy = self.busy_slots() if pausing or self.rng.random() < 0.5 else []
        slot = self.rng.choice(busy or range(len(self.slots)))
        victim = self.slots[slot]
        if pausing:
            self.pause(victim)
            return
        victim.kill()
        self.retired.append(victim)
        self.summary.kills += 1
        self.log(f"SIGKILL {victim.log_path.stem}")
        self.slots[slot] = self.start_worker(slot, time.monotonic() + 90)

    # --- the workload --------------------------------------------------------
    def schedule(self, window: float, faults: list[float]) -> list[float]:
        """When each run starts (seconds into the window): evenly over
        ``window``, but a burst just before each fault, so the flush finds
        queued messages and the restart finds open transactions."""
        n = self.cfg.runs
        burst = min(n // 4, max(3, n // 8))
        times = [max(0.0, at - 0.5) for at in faults for _ in range(burst)]
        rest = n - len(times)
        times += [window * k / rest for k in range(rest)]
        return sorted(times)

    def starter(self, times: list[float]) -> None:
        begin = time.monotonic()
        for i, offset in enumerate(times):
            at = begin + offset
            if self.abort.wait(max(0.0, at - time.monotonic())):  # the workload's pace
                break
            deadline = time.monotonic() + 60
            while True:
                try:
                    handle = self.app.workflow.start(i, idempotency_key=f"chaos-{i}")
                    self.run_ids[i] = handle.run_id
                    break
                except Exception as exc:
                    # The store restarting or the broker flushed: the same key
                    # returns the run if it was recorded; the sweep sends what
                    # a failed publish did not.
                    if time.monotonic() >= deadline or self.abort.is_set():
                        self.errors.append(f"run {i} could not be started: {exc!r}")
                        break
                    self.abort.wait(0.2)  # a retry's pace
        self.summary.runs_started = len(self.run_ids)

    def running_steps(self) -> int:
        try:
            with self.engine.connect() as conn:
                return int(
                    conn.execute(
                        sa.select(sa.func.count()).where(step_table.c.status == "running")
                    ).scalar_one()
                )
        except sa.exc.OperationalError:
            return 0

    def when_busy(self, timeout: float = 5.0) -> int:
        """Steps running now, waiting briefly for some: a fault should hit work."""
        try:
            return wait_until(self.running_steps, timeout=timeout, interval=0.02)
        except AssertionError:
            return 0

    def flush_broker(self) -> None:
        self.summary.steps_running_at_flush = self.when_busy()
        self.broker.flush()  # every queued and unacked message of this run: lost
        self.summary.flushed_broker = True
        self.log(f"broker flushed ({self.summary.steps_running_at_flush} steps running)")

    def restart_postgres(self) -> None:
        self.summary.steps_running_at_restart = self.when_busy()
        began = time.monotonic()
        self.server.restart("immediate")  # a crash: asynchronous claims may be lost
        self.summary.postgres_restart_seconds = time.monotonic() - began
        self.summary.restarted_postgres = True
        self.log(
            f"PostgreSQL restarted in {self.summary.postgres_restart_seconds:.1f} s "
            f"({self.summary.steps_running_at_restart} steps running)"
        )

    def unsettled(self) -> int | None:
        """Runs not yet ended (None while the store cannot be read)."""
        try:
            with self.engine.connect() as conn:
                left = conn.execute(
                    sa.select(sa.func.count()).where(run_table.c.status.not_in(TERMINAL))
                ).scalar_one()
        except sa.exc.OperationalError:
            return None
        return int(left)

    # --- the whole thing -------------------------------------------------------
    def run(self) -> ChaosSummary:
        cfg = self.cfg
        with throwaway_postgres() as server:
            self.server: ThrowawayPostgres = server
            url = server.database_url(self.tag)
            setup = sa.create_engine(url, poolclass=sa.pool.NullPool)
            metadata.create_all(setup)
            chaosapp.ledger.create(setup)
            setup.dispose()
            self.env = chaos_env(self.tag, url, self.broker, cfg.visibility, cfg.sweep)
            self.app = chaosapp.build(self.env)
            assert self.app.pikku.sql_engine is not None
            self.engine = self.app.pikku.sql_engine
            self.counter = redis.Redis.from_url(REDIS_URL)
            try:
                self._run()
                self._check()
            finally:
                self._teardown()
        s = self.summary
        s.wall_seconds = time.monotonic() - self.t0
        return s

    def _run(self) -> None:
        cfg = self.cfg
        self.beat = chaos_beat(self.env, self.workdir)
        self.slots = [self.spawn(slot) for slot in range(cfg.workers)]
        for slot, proc in enumerate(self.slots):
            try:
                proc.wait_ready(timeout=60)
            except AssertionError:
                self.slots[slot] = self.start_worker(slot, time.monotonic() + 60)
        self.beat.wait_ready(timeout=60)
        self.log(f"{cfg.workers} workers and beat up; workdir {self.workdir}")

        faults: list[tuple[float, Callable[[], None]]] = []
        if cfg.flush_broker:
            faults.append((cfg.seconds * 0.35, self.flush_broker))
        if cfg.restart_postgres:
            faults.append((cfg.seconds * 0.65, self.restart_postgres))
        times = self.schedule(cfg.seconds * 0.85, [at for at, _ in faults])
        began = time.monotonic()
        starter = threading.Thread(target=self.starter, args=(times,), daemon=True)
        killer = threading.Thread(target=self.killer, daemon=True)
        starter.start()
        killer.start()
        try:
            for at, fault in faults:
                self.stop.wait(max(0.0, began + at - time.monotonic()))  # the fault's time
                fault()
            self.stop.wait(max(0.0, began + cfg.seconds - time.monotonic()))  # the window
        finally:
            self.stop.set()
            killer.join(timeout=120)
            starter.join(timeout=120)
        end = time.monotonic()
        self.summary.chaos_seconds = end - began
        self.log(
            f"chaos over: {self.summary.kills} kills; "
            f"{self.summary.runs_started} runs started; waiting for all to end"
        )
        try:
            wait_until(lambda: self.unsettled() == 0, timeout=cfg.settle_timeout, interval=0.2)
        except AssertionError:
            left = self.unsettled()
            self.summary.violations.append(
                f"{left} runs had not ended {cfg.settle_timeout:.0f} s after the chaos window"
            )
        self.summary.settle_seconds = time.monotonic() - end
        self.log(f"settled {self.summary.settle_seconds:.1f} s after the window")

    def _teardown(self) -> None:
        self.stop.set()
        self.abort.set()
        for proc in [*self.slots, *([self.beat] if self.beat else [])]:
            proc.teardown()  # SIGKILL
        for proc in self.retired:
            proc.teardown()  # already dead: removes faketime's leftovers
        try:
            self.broker.teardown()  # every key of the run's broker node
            for key in self.counter.scan_iter(match=f"{self.tag}:*", count=1000):
                self.counter.delete(key)
        except redis.RedisError as exc:
            self.log(f"cleanup of Redis keys failed: {exc}")
        self.app.release()
        self.engine.dispose()

    # --- checks ------------------------------------------------------------------
    def _check(self) -> None:
        s = self.summary
        v = s.violations
        v.extend(self.errors)
        if s.runs_started < self.cfg.runs:  # more: probes of a healed worker (hosts suite)
            v.append(f"only {s.runs_started} of {self.cfg.runs} runs were started")
        if self.cfg.flush_broker and not s.flushed_broker:
            v.append("the broker was never flushed")
        if self.cfg.restart_postgres and not s.restarted_postgres:
            v.append("PostgreSQL was never restarted")

        with self.engine.connect() as conn:
            runs = conn.execute(sa.select(run_table)).all()
            steps = conn.execute(sa.select(step_table).where(step_table.c.kind == "task")).all()
            attempts = conn.execute(sa.select(attempt_table)).all()
            ledger_rows = conn.execute(sa.select(chaosapp.ledger)).all()

        s.statuses = dict(Counter(r.status for r in runs))
        for r in runs:
            if r.status != "completed":
                v.append(f"run {r.id} ({r.idempotency_key}) is {r.status}: {r.error}")
        s.steps = len(steps)
        s.attempts = len(attempts)
        s.attempt_statuses = dict(Counter(a.status for a in attempts))
        s.superseded_attempts = s.attempt_statuses.get("superseded", 0)
        s.max_attempt = max((st.attempt for st in steps), default=0)
        s.ledger_rows = len(ledger_rows)

        by_step = {(st.run_id, st.name): st for st in steps}
        attempts_of: dict[str, list[Any]] = {}
        for a in attempts:
            attempts_of.setdefault(a.step_id, []).append(a)
        ledger_of: dict[tuple[str, str], list[Any]] = {}
        for row in ledger_rows:
            ledger_of.setdefault((row.run_id, row.step), []).append(row)
        names = [f"s{k}" for k in range(chaosapp.STEPS)]

        for r in runs:
            if r.status != "completed":
                continue
            output = json.loads(r.output)
            for k, name in enumerate(names):
                st = by_step.get((r.id, name))
                if st is None:
                    v.append(f"run {r.id} completed without step {name}")
                    continue
                if output["steps"][k] != json.loads(st.result or "null"):
                    v.append(f"run {r.id}: output of {name} differs from the step's result")
        for (run_id, name), st in by_step.items():
            where = f"run {run_id} step {name}"
            result = json.loads(st.result) if st.result else None
            if st.status != "succeeded":
                v.append(f"{where} is {st.status} at attempt {st.attempt}")
                continue
            if result != {"step": name, "attempt": st.attempt}:
                v.append(f"{where}: result {result} recorded, step at attempt {st.attempt}")
            rows = sorted(attempts_of.get(st.id, []), key=lambda a: a.attempt)
            numbers = [a.attempt for a in rows]
            if numbers != list(range(1, st.attempt + 1)):
                v.append(f"{where}: attempt rows {numbers} for a step at attempt {st.attempt}")
            won = [a for a in rows if a.status == "succeeded"]
            if [a.attempt for a in won] != [st.attempt]:
                v.append(f"{where}: succeeded attempt rows {[a.attempt for a in won]}")
            elif json.loads(won[0].result or "null") != result:
                v.append(f"{where}: the final attempt row's result differs from the step's")
            for a in rows:
                if a.attempt != st.attempt and a.result is not None:
                    v.append(f"{where}: attempt {a.attempt} ({a.status}) kept a result")
            ledger = ledger_of.get((run_id, name), [])
            if len(ledger) != 1:
                v.append(f"{where}: {len(ledger)} ledger rows {[x.attempt for x in ledger]}")
            elif ledger[0].attempt != st.attempt:
                v.append(f"{where}: ledger row by attempt {ledger[0].attempt}, not {st.attempt}")
            elif won and ledger[0].worker != won[0].worker:
                v.append(f"{where}: ledger row by {ledger[0].worker}, attempt by {won[0].worker}")
        for key in ledger_of:
            if key not in by_step:
                v.append(f"ledger rows for an unknown step {key}")

        self._check_counters(by_step)
        self._check_logs()
        self._check_clocks(attempts, ledger_rows)

    def _check_counters(self, by_step: Mapping[tuple[str, str], Any]) -> None:
        s, v, ns = self.summary, self.summary.violations, self.tag
        keys = [chaosapp.exec_key(ns, run_id, name) for run_id, name in by_step]
        counts = [int(c or 0) for c in (self.counter.mget(keys) if keys else [])]
        s.executions = sum(counts)
        s.reexecutions = s.executions - s.steps
        # An attempt number runs its body twice only when PostgreSQL lost the
        # asynchronous claim that started the first run (the crash): the step
        # reverted, and the next claim took the same attempt number with a
        # new claim id. At most one such claim per step running at the crash.
        twice = {
            _text(k): int(n)
            for k, n in self.counter.hgetall(chaosapp.attempt_runs_key(ns)).items()
            if int(n) > 1
        }
        # ... or when the store lost the step's transaction (the restart)
        # and its worker took it again, as its log says.
        taken = self._taken_again()
        s.taken_again = sum(taken.values())
        for again_key, times in taken.items():
            if again_key in twice:
                twice[again_key] -= times
        twice = {k: n for k, n in twice.items() if n > 1}
        taken_per_step: dict[tuple[str, ...], int] = {}
        for again_key, times in taken.items():
            step_key = tuple(again_key.rsplit(":", 2)[:2])
            taken_per_step[step_key] = taken_per_step.get(step_key, 0) + times
        surplus = sum(n - 1 for n in twice.values())
        lost_allowed = s.steps_running_at_restart if s.restarted_postgres else 0
        if surplus <= lost_allowed:
            s.lost_claims = surplus
        else:
            for what, n in sorted(twice.items())[:20]:
                v.append(f"attempt {what} ran its body {n} times")
        again = {tuple(k.rsplit(":", 2)[:2]): n - 1 for k, n in twice.items()}
        for (run_id, name), count in zip(by_step, counts, strict=True):
            st = by_step[(run_id, name)]
            allowed = st.attempt + (again.get((run_id, name), 0) if surplus <= lost_allowed else 0)
            allowed += taken_per_step.get((run_id, name), 0)
            if st.status == "succeeded" and not 1 <= count <= allowed:
                v.append(
                    f"run {run_id} step {name}: body ran {count} times in {st.attempt} attempts"
                )

    def _taken_again(self) -> dict[str, int]:
        """How often each attempt (``run:step:attempt``) took its lost
        transaction again, from the workers' logs."""
        counts: dict[str, int] = {}
        for path in sorted(self.workdir.glob("w*.log")):
            for found in TAKEN_AGAIN.findall(path.read_text(errors="replace")):
                counts[found] = counts.get(found, 0) + 1
        return counts

    def _check_logs(self) -> None:
        s = self.summary
        for path in sorted(self.workdir.glob("w*.log")):
            text = path.read_text(errors="replace")
            s.refused_logged += len(REFUSED.findall(text))
            s.sweeps_discarded += len(DISCARDED.findall(text))

    def _check_clocks(self, attempts: Sequence[Any], ledger_rows: Sequence[Any]) -> None:
        s, v = self.summary, self.summary.violations
        procs = {
            _text(k): json.loads(m)
            for k, m in self.counter.hgetall(chaosapp.procs_key(self.tag)).items()
        }
        fast_procs = {w for w, m in procs.items() if m["skewed"]}
        s.skewed_processes = len(fast_procs)
        offsets = {w: m["clock"] - m["redis_clock"] for w, m in procs.items()}
        for w, off in offsets.items():
            want = SKEW_SECONDS if w in fast_procs else 0.0
            if abs(off - want) > CLOCK_TOLERANCE:
                v.append(f"process {w} (skewed={w in fast_procs}) has its clock {off:+.1f} s off")
        if fast_procs:
            s.skew_seconds = sum(offsets[w] for w in fast_procs) / len(fast_procs)
        s.skewed_attempts = sum(1 for a in attempts if a.worker in fast_procs)
        for row in ledger_rows:
            off = (row.worker_clock_ms - row.db_clock_ms) / 1000
            fast = abs(off - SKEW_SECONDS) <= CLOCK_TOLERANCE
            if not fast and abs(off) > CLOCK_TOLERANCE:
                v.append(f"ledger row {row.id} by {row.worker}: worker clock {off:+.1f} s off")
            if fast != (row.worker in fast_procs):
                v.append(f"ledger row {row.id} by {row.worker}: clock {off:+.1f} s unexpected")
            s.skewed_ledger_rows += fast
        if self.cfg.skew_worker:
            if not fast_procs:
                v.append("no skewed worker process ever started a pool process")
            elif not s.skewed_attempts:
                v.append("the skewed worker claimed no attempt: it took no part")
            elif not s.skewed_ledger_rows:
                v.append("the skewed worker committed no step")
        elif fast_procs:
            v.append(f"skewed processes {sorted(fast_procs)} in a run without --skew-worker")

    # --- reporting -------------------------------------------------------------
    def log_tails(self, chars: int = 3000) -> str:
        procs = [*self.slots, *([self.beat] if self.beat else [])]
        parts = [f"--- {p.log_path.name}\n{p.log()[-chars:]}" for p in procs]
        return "\n".join(parts) + f"\n(all logs in {self.workdir})"


def run_chaos(cfg: ChaosConfig, echo: Echo = print, check: bool = True) -> ChaosSummary:
    """Run one chaos run and return its summary.

    With ``check`` an :class:`AssertionError` lists every violation, followed
    by the summary and the tails of the workers' logs (kept on disk then).
    """
    chaos = _Chaos(cfg, echo)
    failed = True
    try:
        summary = chaos.run()
        failed = bool(summary.violations)
    finally:
        if failed:
            echo(chaos.log_tails())
        elif not cfg.keep_logs:
            shutil.rmtree(chaos.workdir, ignore_errors=True)
    echo(summary.render())
    if check and summary.violations:
        head = "\n".join(f"- {x}" for x in summary.violations[:40])
        raise AssertionError(
            f"chaos run broke {len(summary.violations)} invariant(s):\n{head}\n\n"
            f"{summary.render()}\n\nlogs: {chaos.workdir}"
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the chaos window")
    parser.add_argument("--kill-every", type=float, default=3.0, help="mean seconds between kills")
    parser.add_argument(
        "--pause-share", type=float, default=0.25, help="share of SIGSTOP pauses among kills"
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--skew-worker", action="store_true", help="one worker an hour fast")
    parser.add_argument("--settle-timeout", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None, help="parent folder of the logs")
    args = parser.parse_args(argv)
    cfg = ChaosConfig(
        runs=args.runs,
        seconds=args.minutes * 60,
        kill_every=args.kill_every,
        pause_share=args.pause_share,
        workers=args.workers,
        concurrency=args.concurrency,
        skew_worker=args.skew_worker,
        settle_timeout=args.settle_timeout,
        seed=args.seed,
        keep_logs=args.keep_logs,
        workdir=args.workdir,
    )
    # Stop cleanly (workers killed, throwaway PostgreSQL removed) on SIGTERM, and
    # on SIGINT even when started in the background, where it is ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run_chaos(cfg, echo=lambda line: print(line, flush=True))
    except AssertionError as exc:
        print(f"FAILED: {str(exc).split(chr(10) * 2)[0]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
