"""Fuzzed pikku messages on a real worker: garbage changes nothing.

Twenty four-step workflows (:mod:`tests.reliability.fuzzapp`) run on one real
``celery worker`` (prefork, two processes) and ``celery beat``, Redis broker,
PostgreSQL store. While they run, the test sends a few hundred forged
``pikku.run_step`` and ``pikku.orchestrate`` messages (and a few with wrong
task names): a real step id with the run id of ANOTHER run, ids that are no
UUID (ints, huge ints, floats, None, lists, dicts, empty and very long
strings, NULs, lone surrogates), UUIDs of nothing, wrong arity and unknown
keyword arguments. Most step forgeries go to the other step queue than the
step's own message, so they often reach the worker first and meet the step
unclaimed. Every choice comes from a seeded :class:`random.Random`
(``PIKKU_FUZZ_SEED=<seed>`` replays the choices; which real ids they pick up
still depends on how far the runs got; every failure message names the seed).

Then every run must complete with its own output, each of its steps with
exactly one attempt row (attempt 1); the store must hold nothing else (the
twenty runs, their four steps each, no signal); no forged message may have
run a step body (each body logs the id of the message that ran it); and the
worker must be alive.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pikku_celery.celery.dispatcher import ORCHESTRATE, RUN_STEP, SWEEP
from pikku_celery.celery.step_body import attempt_task_id
from pikku_celery.sql.schema import attempt_table, run_table, signal_table, step_table
from pikku_celery.store import AttemptStatus, RunStatus, StepState, StepStatus
from pikku_celery.store.migrate import upgrade
from tests.celery.workers import BeatProcess, WorkerProcess, beat, worker
from tests.helpers import wait_until
from tests.services import (
    PG_ADMIN_URL,
    SESSION_TAG,
    reachable_redis,
    scratch_database,
)

from . import fuzzapp

pytestmark = pytest.mark.slow

APP_MODULE = "tests.reliability.fuzzapp"
BROKER_REDIS_DB = 12  # this test's own: never flushed, only its queues are removed
RUNS = 20
ROUNDS = 10
PER_ROUND = 36  # ROUNDS * PER_ROUND forged messages
VISIBILITY = 5.0
SWEEP_SECONDS = 1.0
SETTLE_TIMEOUT = 40.0
DRAIN_TIMEOUT = 15.0
ROUND_TIMEOUT = 6.0  # a round waits at most this long for the runs to progress
TASK_STEPS = RUNS * len(fuzzapp.STEP_NAMES)

UUID_RE = re.compile(r"[0-9a-fA-F]{8}(?:-?[0-9a-fA-F]{4}){3}-?[0-9a-fA-F]{12}")
BODY_RAN = re.compile(re.escape(fuzzapp.BODY_MARK) + r" (\S+) ran from message (\S+)")
WORKER_LOST = re.compile(r"WorkerLostError|exited prematurely|pid:\d+ exited")


# --- processes ---------------------------------------------------------------------


@dataclass
class Cluster:
    env: dict[str, str]
    app: fuzzapp.FuzzApp
    broker: redis.Redis
    workdir: Path
    worker: WorkerProcess
    beat: BeatProcess

    @property
    def engine(self) -> sa.Engine:
        engine = self.app.pikku.sql_engine
        assert engine is not None
        return engine


def _forget_queues(client: redis.Redis, queues: list[str]) -> None:
    """Delete this test's queues from the broker: lists, bindings, unacked entries."""
    for q in queues:
        for pattern in (f"{q}*", f"_kombu.binding*.{q}"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
    for tag, raw in client.hgetall("unacked").items():
        try:
            routing_key = json.loads(raw)[2]
        except (ValueError, IndexError, TypeError):
            continue
        if routing_key in queues:
            client.hdel("unacked", tag)
            client.zrem("unacked_index", tag)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    broker_url, client = reachable_redis(BROKER_REDIS_DB)
    tag = f"{SESSION_TAG}_fuzz"
    with scratch_database(PG_ADMIN_URL, tag) as url:
        upgrade(url)
        env = {
            "PIKKU_FUZZ_BROKER": broker_url,
            "PIKKU_FUZZ_DATABASE": url,
            "PIKKU_FUZZ_QUEUE": tag,
            "PIKKU_FUZZ_VISIBILITY": str(VISIBILITY),
            "PIKKU_FUZZ_SWEEP": str(SWEEP_SECONDS),
        }
        app = fuzzapp.build(env)
        worker_node = worker(
            env,
            app.queues,
            tmp_path / "worker.log",
            f"fuzz-{SESSION_TAG}",
            concurrency=2,
            app_module=APP_MODULE,
        )
        beat_node = beat(env, tmp_path, app_module=APP_MODULE)
        try:
            worker_node.wait_ready(timeout=60)
            beat_node.wait_ready(timeout=60)
            yield Cluster(env, app, client, tmp_path, worker_node, beat_node)
        finally:
            worker_node.kill()  # SIGKILL: the test checked the worker while it ran
            beat_node.kill()
            _forget_queues(client, app.queues)
            client.close()
            assert app.pikku.sql_engine is not None
            app.pikku.sql_engine.dispose()


# --- the fuzzer --------------------------------------------------------------------


@dataclass(frozen=True)
class StepRow:
    id: str
    run_id: str
    name: str
    status: str
    task_name: str | None
    queue: str | None
    attempt: int


@dataclass
class Message:
    name: str
    args: list[Any]
    kwargs: dict[str, Any] | None
    queue: str
    kind: str


WRONG_NAMES = (
    "pikku.run_stepx",
    "pikku.Run_Step",
    "pikku.run_step:fuzz.add",  # fuzz.add has no rate limit: no such proxy task
    "pikku.run_step:nope",
    " pikku.orchestrate",
    "pikku.orchestrate ",
    "pikku.",
    "pikku.nope",
    "fuzz.nope",
    "celery.nope",
    "x" * 300,
)


@dataclass
class Fuzzer:
    rng: random.Random
    runs: list[str]
    step_queue: str
    tag_queue: str
    steps: list[StepRow] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)

    # --- values ----------------------------------------------------------------
    def _other_run(self, not_of: str | None) -> str:
        return self.rng.choice([r for r in self.runs if r != not_of] or self.runs)

    def _step(self) -> StepRow:
        """A real step: most often one still waiting for its message to be taken."""
        waiting = [s for s in self.steps if s.status in ("pending", "scheduled")]
        pool = waiting if waiting and self.rng.random() < 0.8 else self.steps
        return self.rng.choice(pool)

    def _id_variant(self, real: str) -> Any:
        """A near miss of a real id: other spellings, cut, padded, or smuggled."""
        r = self.rng
        return r.choice(
            [
                real.upper(),
                real.replace("-", ""),
                "{" + real + "}",
                "urn:uuid:" + real,
                real + " ",
                " " + real,
                real[:-1],
                real + "0",
                real[:8] + "\x00" + real[9:],
                real + "' OR '1'='1",
                [real],
                {"id": real},
                {"run_id": real, "step_id": real},
            ]
        )

    def junk(self, not_of: str | None = None) -> Any:
        """A value that no id, attempt, task name or queue should be. Real ids
        (and their variants) come from runs other than ``not_of``."""
        r = self.rng
        makers: list[Callable[[], Any]] = [
            lambda: 44,
            lambda: 0,
            lambda: -1,
            lambda: 10**30,
            lambda: -(10**30),
            lambda: 2**63,
            lambda: 3.14,
            lambda: -0.0,
            lambda: 1e308,
            lambda: float("inf"),
            lambda: None,
            lambda: True,
            lambda: [],
            lambda: [44, None],
            lambda: {},
            lambda: {"a": [1, {"b": None}]},
            lambda: "",
            lambda: " ",
            lambda: "x" * r.randint(256, 60_000),
            lambda: "é" * r.randint(37, 5_000),
            lambda: str(uuid.UUID(int=r.getrandbits(128), version=4)),  # a UUID of nothing
            lambda: str(uuid.UUID(int=0)),
            lambda: "44",
            lambda: "0x2c",
            lambda: "' OR '1'='1",
            lambda: "1; DROP TABLE pikku_workflow_run; --",
            lambda: "\x00",
            lambda: "\ud800",
            lambda: "\U0001d52d\U0001d526\U0001d528",  # astral-plane letters
            lambda: RUN_STEP,
            lambda: "fuzz.add",
            lambda: self._other_run(not_of),
            lambda: self._id_variant(self._other_run(not_of)),
            lambda: self._step_of_other(not_of).id,
            lambda: self._id_variant(self._step_of_other(not_of).id),
        ]
        return r.choice(makers)()

    def _step_of_other(self, not_of: str | None) -> StepRow:
        others = [s for s in self.steps if s.run_id != not_of]
        return self.rng.choice(others or self.steps)

    def _attempt(self, step: StepRow) -> Any:
        return self.rng.choice([1, 1, step.attempt, step.attempt + 1, 0, 2, -1])

    def _task(self, step: StepRow) -> Any:
        other = self.rng.choice([t for t in fuzzapp.TASKS if t != step.task_name])
        return self.rng.choice([step.task_name, step.task_name, other, ORCHESTRATE, "fuzz.nope"])

    def _queue_of(self, step: StepRow) -> str:
        """Where a forged message for ``step`` goes: mostly the OTHER step queue,
        whose backlog is not the one the step's own message waits in, so the
        forgery often arrives first and meets the step still unclaimed."""
        own = step.queue or self.step_queue
        other = self.tag_queue if own == self.step_queue else self.step_queue
        return other if self.rng.random() < 0.6 else own

    def _any_queue(self) -> str:
        return self.rng.choice([self.step_queue, self.tag_queue])

    # --- messages ----------------------------------------------------------------
    def _crossed(self) -> tuple[StepRow, list[Any]]:
        """Real (run_step) arguments, except that the run is another run's."""
        s = self._step()
        args: list[Any] = [self._other_run(s.run_id), s.id, self._attempt(s), self._task(s)]
        if self.rng.random() < 0.7:
            args.append(self.rng.choice([s.queue, s.queue, None, self._any_queue()]))
        return s, args

    def message(self) -> Message:
        r = self.rng
        kind = r.choices(
            ["cross", "junk-step", "arity", "kwargs", "orchestrate", "wrong-name"],
            weights=[40, 20, 10, 5, 17, 8],
        )[0]
        self.kinds[kind] += 1
        if kind == "cross":
            s, args = self._crossed()
            return Message(RUN_STEP, args, None, self._queue_of(s), kind)
        if kind == "junk-step":
            s, args = self._crossed()
            for i in r.sample(range(len(args)), r.randint(1, min(3, len(args)))):
                args[i] = self.junk(not_of=s.run_id)
            return Message(RUN_STEP, self._unpaired(args), None, self._queue_of(s), kind)
        if kind == "arity":
            s, args = self._crossed()
            n = r.choice([0, 1, 2, 3, 6, 7, 9])
            pool = [*args, *(self.junk(not_of=s.run_id) for _ in range(9))]
            return Message(RUN_STEP, pool[:n], None, self._queue_of(s), kind)
        if kind == "kwargs":
            s, args = self._crossed()
            choice = r.randrange(3)
            if choice == 0:  # the real parameters, by keyword, with another run's id
                kwargs: dict[str, Any] = {"attempt": args[2], "task_name": args[3]}
                return Message(RUN_STEP, args[:2], kwargs, self._queue_of(s), kind)
            if choice == 1:  # an unknown keyword
                return Message(RUN_STEP, args, {"bogus": self.junk()}, self._queue_of(s), kind)
            return Message(  # a parameter given twice
                RUN_STEP, args, {"run_id": self.junk(not_of=s.run_id)}, self._queue_of(s), kind
            )
        if kind == "orchestrate":
            choice = r.randrange(7)
            run = r.choice(self.runs)
            args = {
                0: [self.junk()],
                1: [run, self.junk()],  # a real run, a junk reason: a harmless pass
                2: [self._step().id],  # a step id where a run id goes
                3: [],
                4: [run, "x", self.junk()],
                5: [self.junk(), self.junk()],
                6: [self._id_variant(run)],
            }[choice]
            extra = {"bogus": 1} if choice == 3 and r.random() < 0.5 else None
            return Message(ORCHESTRATE, args, extra, self.step_queue, kind)
        name = r.choice([*WRONG_NAMES, SWEEP])
        args = [self.junk() for _ in range(r.randint(1, 5))]  # SWEEP takes none: refused
        return Message(name, args, None, self._any_queue(), kind)

    def _unpaired(self, args: list[Any]) -> list[Any]:
        """``args`` with a run id that is never the run of the step id beside it
        (after the junk, either may be any real id, in any spelling)."""
        owner = {s.id: s.run_id for s in self.steps}.get(_canonical(args[1]) or "")
        if owner is not None and _canonical(args[0]) == owner:
            args[0] = self._other_run(owner)
        return args


def _canonical(value: Any) -> str | None:
    """The canonical UUID text ``value`` spells, if it spells one."""
    if not isinstance(value, str):
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


# --- reading the store -------------------------------------------------------------


def _steps(engine: sa.Engine) -> list[StepRow]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                step_table.c.id,
                step_table.c.run_id,
                step_table.c.name,
                step_table.c.status,
                step_table.c.task_name,
                step_table.c.queue,
                step_table.c.attempt,
            )
        ).all()
    return [StepRow(*row) for row in rows]


def _succeeded(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(step_table.c.status == StepStatus.SUCCEEDED.value)
            ).scalar_one()
        )


def _unsettled(engine: sa.Engine, run_ids: list[str]) -> int:
    terminal = [s.value for s in RunStatus if s.terminal]
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    run_table.c.id.in_(run_ids), run_table.c.status.not_in(terminal)
                )
            ).scalar_one()
        )


def _poll(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll until ``predicate`` holds; False (not an error) once ``timeout`` passes."""
    try:
        wait_until(predicate, timeout=timeout, interval=0.05)
    except AssertionError:
        return False
    return True


def _in_flight(cluster: Cluster) -> int:
    """Messages on this test's queues, queued or taken and not yet acked
    (the sweeps beat keeps sending aside)."""
    queues = cluster.app.queues
    n = 0
    for q in queues:
        for raw in cluster.broker.lrange(q, 0, -1):
            if json.loads(raw).get("headers", {}).get("task") != SWEEP:
                n += 1
    for raw in cluster.broker.hvals("unacked"):
        payload, _exchange, routing_key = json.loads(raw)
        if routing_key in queues and payload.get("headers", {}).get("task") != SWEEP:
            n += 1
    return n


def _state(row: Any, attempt: int) -> StepState:
    """Enough of a step row, at ``attempt``, for :func:`attempt_task_id`."""
    return StepState(
        id=row.id,
        run_id=row.run_id,
        name=row.name,
        seq=row.seq,
        kind=row.kind,
        status=row.status,
        attempt=attempt,
    )


def _short(args: list[Any]) -> str:
    text = repr(args)
    return text if len(text) <= 300 else text[:300] + "...]"


def _error_summary(log: str, limit: int = 40) -> str:
    """The worker's ERROR lines, grouped (ids and numbers masked), each with a
    verbatim example."""
    groups: dict[str, list[str]] = {}
    for line in log.splitlines():
        if "ERROR/" not in line and "CRITICAL/" not in line:
            continue
        body = re.sub(r"^\[[^\]]*\]\s*", "", line)
        key = UUID_RE.sub("<id>", body)
        key = re.sub(r"\[[0-9a-f-]{36}\]", "[<task>]", key)
        key = re.sub(r"x{20,}|(?:é){20,}", "<long>", key)
        key = re.sub(r"\d+", "<n>", key)[:200]
        groups.setdefault(key, []).append(line)
    out = []
    for lines in sorted(groups.values(), key=len, reverse=True)[:limit]:
        example = lines[0] if len(lines[0]) <= 600 else lines[0][:600] + "..."
        out.append(f"  {len(lines):4d} x {example}")
    return "\n".join(out) or "  (none)"


# --- the test ----------------------------------------------------------------------


def test_forged_messages_change_nothing(cluster: Cluster) -> None:
    seed = int(os.environ.get("PIKKU_FUZZ_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    t0 = time.monotonic()
    engine = cluster.engine
    app = cluster.app
    handles = [app.workflow.start({"i": i, "word": f"w{i}"}) for i in range(RUNS)]
    run_ids = [h.run_id for h in handles]
    index = {run_id: i for i, run_id in enumerate(run_ids)}
    fuzz = Fuzzer(rng, run_ids, app.step_queue, app.tag_queue)

    sent = 0
    forged: dict[str, Message] = {}  # by the task id each forged message was sent with
    send_failures: Counter[str] = Counter()
    for round_no in range(ROUNDS):
        # Each round goes out once the runs have made about 1/ROUNDS of their
        # progress (or they have all ended, or ROUND_TIMEOUT passed).
        target = round_no * TASK_STEPS // ROUNDS

        def progressed(target: int = target) -> bool:
            return _succeeded(engine) >= target or _unsettled(engine, run_ids) == 0

        _poll(progressed, ROUND_TIMEOUT)
        fuzz.steps = _steps(engine)
        for _ in range(PER_ROUND):
            m = fuzz.message()
            task_id = str(uuid.uuid4())
            try:
                app.app.send_task(
                    m.name,
                    args=m.args,
                    kwargs=m.kwargs,
                    queue=m.queue,
                    serializer="json",
                    task_id=task_id,
                )
                forged[task_id] = m
                sent += 1
            except Exception as exc:  # what the client refuses never reaches a worker
                send_failures[f"{m.kind}: {type(exc).__name__}: {str(exc)[:120]}"] += 1
    fuzz_done = time.monotonic() - t0

    def report(problems: list[str]) -> str:
        return (
            f"seed {seed} (replay: PIKKU_FUZZ_SEED={seed}); {sent} forged messages sent "
            f"{dict(fuzz.kinds)}, {sum(send_failures.values())} refused by the client "
            f"{dict(send_failures)}; fuzzing took {fuzz_done:.1f} s, "
            f"{time.monotonic() - t0:.1f} s in all\n"
            + "\n".join(f"- {p}" for p in problems)
            + f"\nworker ERROR lines:\n{_error_summary(cluster.worker.log())}"
            + f"\nworker log: {cluster.worker.log_path}"
        )

    assert sent >= ROUNDS * PER_ROUND // 2, report(["too few forged messages were sent"])

    problems: list[str] = []
    if not _poll(lambda: _unsettled(engine, run_ids) == 0, SETTLE_TIMEOUT):
        problems.append(
            f"settle: {_unsettled(engine, run_ids)} of {RUNS} runs had not ended "
            f"{SETTLE_TIMEOUT:.0f} s after the fuzzing"
        )
    # Every forged message taken and acked: whatever it could write is written.
    if not _poll(lambda: _in_flight(cluster) == 0, DRAIN_TIMEOUT):
        problems.append(f"drain: {_in_flight(cluster)} messages still in flight")

    # 1. every run completed, with its own output
    store = app.pikku.store
    for run_id, i in index.items():
        run = store.get_run(run_id)
        if run is None:
            problems.append(f"run {i} ({run_id}): missing")
            continue
        if run.status != RunStatus.COMPLETED:
            problems.append(f"run {i} ({run_id}): {run.status}, error {run.error}")
        elif run.output != fuzzapp.expected(i):
            problems.append(
                f"run {i} ({run_id}): output {run.output!r}, expected {fuzzapp.expected(i)!r}"
            )

    with engine.connect() as conn:
        runs = conn.execute(sa.select(run_table.c.id, run_table.c.workflow)).all()
        steps = conn.execute(sa.select(step_table)).all()
        attempts = conn.execute(sa.select(attempt_table)).all()
        signals = conn.execute(sa.select(signal_table)).all()

    # 2. nothing else written: the twenty runs, their steps, no signal
    extra_runs = [r for r in runs if r.id not in index]
    if len(runs) != RUNS or extra_runs:
        problems.append(f"runs table: {len(runs)} rows, not of ours: {extra_runs[:5]}")
    if signals:
        problems.append(f"signals table: {len(signals)} rows: {signals[:5]}")
    by_step: dict[str, list[Any]] = {}
    for a in attempts:
        by_step.setdefault(a.step_id, []).append(a)
    step_ids = {s.id for s in steps}
    stray = [a for a in attempts if a.step_id not in step_ids]
    if stray:
        problems.append(f"attempts table: {len(stray)} rows of no step: {stray[:5]}")
    if len(steps) != TASK_STEPS:
        problems.append(f"steps table: {len(steps)} rows, expected {TASK_STEPS}")

    # 3. each run's steps: its four, its results, one attempt each
    per_run: dict[str, dict[str, Any]] = {}
    for s in steps:
        if s.run_id not in index:
            problems.append(f"step {s.id} ({s.name}) of unknown run {s.run_id!r}")
            continue
        i = index[s.run_id]
        if s.name in per_run.setdefault(s.run_id, {}):
            problems.append(f"run {i}: step {s.name!r} twice")
        per_run[s.run_id][s.name] = s
        where = f"run {i} step {s.name!r} ({s.id})"
        want = fuzzapp.expected_steps(i).get(s.name)
        if s.status != StepStatus.SUCCEEDED.value or s.attempt != 1:
            problems.append(f"{where}: status {s.status}, attempt {s.attempt}, error {s.error}")
        if s.result is None or json.loads(s.result) != want:
            problems.append(f"{where}: result {s.result!r}, expected {want!r}")
        rows = by_step.get(s.id, [])
        shape = [(a.attempt, a.status, a.run_id == s.run_id) for a in rows]
        if shape != [(1, AttemptStatus.SUCCEEDED.value, True)]:
            problems.append(f"{where}: attempt rows (attempt, status, own run) {shape}")
    for run_id, i in index.items():
        names = sorted(per_run.get(run_id, {}))
        if names != sorted(fuzzapp.STEP_NAMES):
            problems.append(f"run {i}: steps {names}, expected {sorted(fuzzapp.STEP_NAMES)}")

    # 4. no forged message ran a step body (each body logs its message's id)
    bodies = {attempt_task_id(_state(s, n)): s for s in steps for n in (1, 2, 3)}
    marks = BODY_RAN.findall(cluster.worker.log())
    # Every real body left its mark, so the marks (and this check) see them all.
    logged = {body for body, _ in marks}
    unmarked = [s.name for s in steps if attempt_task_id(_state(s, 1)) not in logged]
    if unmarked:
        problems.append(
            f"{len(unmarked)} step bodies left no mark in the worker log: {unmarked[:6]}"
        )
    by_forgery = []
    for body, parent in marks:
        msg = forged.get(parent)
        if msg is None:
            continue
        ran = bodies.get(body)
        whose = "an unknown step" if ran is None else f"run {index.get(ran.run_id)} {ran.name!r}"
        named = _canonical(msg.args[0]) if msg.args else None
        own = ran is not None and named == ran.run_id
        by_forgery.append(
            f"{whose} by a {msg.kind} {msg.name} naming "
            + ("ITS OWN run (a fuzzer bug)" if own else f"run {index.get(named or '', named)}")
            + f": {_short(msg.args)}"
        )
    if by_forgery:
        problems.append(
            f"forged messages ran {len(by_forgery)} step bodies: " + "; ".join(by_forgery[:6])
        )

    # 5. the worker is alive, and so were its pool processes throughout
    if cluster.worker.container.status != "running":
        problems.append("worker: its main process has exited")
    lost = [line for line in cluster.worker.log().splitlines() if WORKER_LOST.search(line)]
    if lost:
        problems.append(f"worker: pool processes lost: {lost[:5]}")

    assert not problems, report(problems)
    print(report(["none"]))  # shown with -s: what was sent, what the worker refused
