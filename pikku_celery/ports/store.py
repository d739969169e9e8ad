"""The workflow store port: the source of truth of every run.

Ownership operations (claim, complete, fail, refresh) are each one guarded
write judged on the store's clock. A pass is the engine's: the store reads
the run for it (:meth:`WorkflowStore.read_pass`) and writes its plan in one
transaction if the run has not moved (:meth:`WorkflowStore.write_pass`); it
never calls back into the engine. A store keeps no state between calls:
what the engine knows of a run (a claim's view, what the last pass left) it
hands to the call that can use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ..model.cursor import COUNT_CAP, RunCursor
from ..model.plan import Claim, Moved, PassView, PassWrite
from ..model.slots import HasConcurrencySlots
from ..model.values import (
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    AuditAction,
    AuditEntry,
    Decision,
    Delivery,
    ErrorInfo,
    NewRun,
    Operator,
    RunState,
    RunStatus,
    RunView,
    Settled,
    StepState,
    StepStatus,
)

Decide = Callable[[RunView], Decision]
"""The engine's replay: what a pass decides on the run as it sees it."""


@runtime_checkable
class WorkflowStore(Protocol):
    """Where runs, steps and attempts live; every outcome write is fenced by attempt."""

    # --- clock ---------------------------------------------------------------
    def now_ms(self) -> int:
        """The store's clock, epoch milliseconds."""
        ...

    # --- runs ----------------------------------------------------------------
    def create_run(self, new: NewRun) -> tuple[RunState, bool]:
        """Insert a running run; with an idempotency key already used for the
        same workflow, return that run instead. The bool says if it was created."""
        ...

    def get_run(self, run_id: str) -> RunState | None:
        """The run, or None if there is no run with that id."""
        ...

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 50,
        offset: int = 0,
        before: RunCursor | None = None,
    ) -> list[RunState]:
        """Newest first by ``(created_at, id)``; ``since``/``until`` bound
        ``created_at`` (epoch ms); ``before`` lists only the runs after a
        page's cursor (:class:`~pikku_celery.model.cursor.RunCursor`): a
        keyset page costs the same however deep it is, an ``offset`` does not."""
        ...

    def request_cancel(self, run_id: str) -> RunState:
        """Flag a live run for cancellation (the next pass ends it). Raises
        :class:`RunNotFoundError`; a settled run is returned unchanged."""
        ...

    def send_signal(self, run_id: str, name: str, payload: JSON) -> RunState:
        """Record a signal for the run and bump its version so the next pass
        sees it. The first one of a name stands: the same payload again is
        taken (and bumps the version), another raises
        :class:`SignalAlreadySentError`. Raises on an unknown run."""
        ...

    def retry_run(self, run_id: str) -> RunState:
        """Reopen a failed run: its failed steps get fresh attempts."""
        ...

    # --- the audit trail: what operators did -------------------------------
    def record_action(
        self,
        run_id: str,
        action: AuditAction,
        operator: Operator,
        details: dict[str, JSON] | None = None,
    ) -> AuditEntry:
        """Keep an operator's action on the run, at the store's clock; kept
        for good, whatever the run does next."""
        ...

    def audit_trail(self, run_id: str) -> list[AuditEntry]:
        """The run's operator actions, oldest first (empty for none)."""
        ...

    # --- reads for people: the run page and the command line -----------------
    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepState]]:
        """The steps of each run named, in order, in one read (the runs list
        says what a live run waits for); a run with none is left out."""
        ...

    def count_runs_by_status(
        self,
        *,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        """How many runs there are of each status (every status a key, 0 for
        none), with :meth:`list_runs`'s filters but the status."""
        ...

    def count_runs_capped(
        self,
        *,
        cap: int = COUNT_CAP,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        """As :meth:`count_runs_by_status`, but each status counted up to
        ``cap + 1`` runs only (more than ``cap`` reads as "cap+"): what the run
        page shows, at a cost that does not grow with the table."""
        ...

    def count_steps_by_status(self) -> dict[StepStatus, int]:
        """How many steps there are of each status (every status a key)."""
        ...

    def count_attempts_by_status(self) -> dict[AttemptStatus, int]:
        """How many attempt rows there are of each status (every status a key):
        append-only, so each count only grows (metrics read them as counters)."""
        ...

    def runs_with_key(self, idempotency_key: str, limit: int = 50) -> list[RunState]:
        """Runs started with this idempotency key, of any workflow, newest first."""
        ...

    def get_signals(self, run_id: str) -> dict[str, JSON]:
        """The signals sent to the run, name to payload (the first of each
        name, which is the one its wait sees); empty for an unknown run."""
        ...

    def in_flight_views(self, after_id: str | None = None, limit: int = 500) -> list[RunView]:
        """Runs not yet settled, each with its steps (in order) and signals, as
        a pass would see them: at most ``limit``, by id, after ``after_id``.

        Read in bulk for the deploy check (a few statements per page, none
        per run); reads only."""
        ...

    # --- steps ---------------------------------------------------------------
    def get_steps(self, run_id: str) -> list[StepState]:
        """All steps of a run in one query, in the order they were recorded."""
        ...

    def get_step_outlines(self, run_id: str) -> list[StepState]:
        """Every step of the run in order, without its payloads (``args``,
        ``kwargs``, ``result``, ``error`` and ``route`` left empty): what the
        run waits for, its timers and its counts, at a fraction of the read."""
        ...

    def get_steps_page(self, run_id: str, after_seq: int | None, limit: int) -> list[StepState]:
        """At most ``limit`` steps of the run with ``seq`` above ``after_seq``
        (None: from the first), in order: a long history read a page at a
        time, each page at the cost of the first."""
        ...

    def get_step(self, step_id: str, *, run_id: str | None = None) -> StepState | None:
        """The step, or None if there is no step with that id (of run
        ``run_id``: a step of another run reads as none).

        Every method that addresses a step by its id takes ``run_id``: the
        engine always names it (its messages carry it), which keeps each
        statement to the run's rows (one shard where the tables are
        distributed by run). A caller that does not name it costs the store
        one read of the step's run first."""
        ...

    def event_steps(self, run_id: str, key: str | None = None) -> list[StepState]:
        """The run's progress events (its value steps ``event:<key>#<n>``),
        of ``key`` or of every key, in the order recorded: what a reader
        polling for progress reads, not the whole history."""
        ...

    def get_attempts(self, run_id: str) -> list[AttemptState]:
        """Every attempt of every step of the run, oldest first."""
        ...

    def get_attempts_page(
        self, run_id: str, after_seq: int | None, through_seq: int
    ) -> list[AttemptState]:
        """The attempts of the run's steps with ``seq`` above ``after_seq``
        (None: from the first) up to ``through_seq``, oldest first: the
        attempts of one page of :meth:`get_steps_page`."""
        ...

    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
    ) -> StepState | None:
        """Take the step for a new attempt, in one guarded write.

        pending/scheduled -> running (attempt + 1); failed with attempts left
        and its retry due, or running with a lapsed lease and attempts left ->
        running as attempt + 1. A lease lapses when its own expiry passes,
        whatever ``lease_ms`` (the lease this claim grants) is; one ending
        beyond ``now + bound_ms`` (the fleet's longest lease: an edited row, a
        clock set back) counts as lapsed too. The lease is written on the
        store's clock. With
        ``run_id``, a step of another run is never claimed (a stale or forged
        message). ``delivery`` (the carrying Celery message and node) is
        written on the new attempt's row by the same write. None when someone
        else owns it or it is settled. Raises
        :class:`WorkflowStepFunctionMismatchError` if ``task_name`` differs
        from the recorded one.
        """
        ...

    def claim(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
        known: PassView | None = None,
    ) -> Claim | None:
        """:meth:`claim_step`, with the run as the claim saw it (read by the
        same round trip where the store can), for the attempt's pass
        (``Claim.view``; None: that pass reads). ``known``: the run as the
        pass that scheduled the step left it, which a store may take
        instead of reading the run while its version still matches."""
        ...

    def refresh_step_lease(
        self,
        step_id: str,
        attempt: int,
        lease_ms: int | None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> bool:
        """Extend the lease of the current attempt; None parks the step.
        False once the step is no longer that attempt's, or no longer that
        claim's (``claim_id`` of the claimed step; None: any claim), or is
        not of run ``run_id``."""
        ...

    def complete_step(
        self,
        step_id: str,
        attempt: int,
        result: JSON,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        """Fenced success: raises :class:`WorkflowStepSupersededError` and
        changes nothing unless ``attempt`` (and its claim ``claim_id``) is
        current and running, and the step is of run ``run_id`` (when named)."""
        ...

    def fail_step(
        self,
        step_id: str,
        attempt: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        """Fenced failure; ``retry_delay`` keeps attempts open (if any are left)."""
        ...

    def expire_step(
        self, step_id: str, bound_ms: int | None = None, *, run_id: str | None = None
    ) -> bool:
        """Fail a running step whose lease lapsed (or ends beyond ``now +
        bound_ms``) with no attempts left (``WorkflowStepLeaseExpiredError``).
        True if it did."""
        ...

    def mark_scheduled(self, step_ids: Sequence[str]) -> None:
        """Record that a message for each step was just sent."""
        ...

    # --- the orchestration pass ---------------------------------------------
    def read_pass(
        self, run_id: str, known: PassView | None = None, optimistic: bool = False
    ) -> PassView:
        """The run, its steps and signals as a pass sees them, on the store's
        clock (:class:`RunNotFoundError` for none). ``known``: the run as the
        engine already knows it (a claim's view, a run just created), which a
        store may take instead of reading while it is good
        (:meth:`~pikku_celery.model.plan.PassView.kept`); ``optimistic``: the
        pass may take an unlocked read (a pass recording an outcome, the
        first time: a plan its one write cannot take then reads again, locked)."""
        ...

    def write_pass(self, read: PassView, plan: PassWrite) -> AdvanceResult | Moved:
        """Write ``plan`` (made on ``read``) in one transaction, only on the
        run's version ``read`` saw: :class:`Moved`, with nothing written, if
        another pass or a signal landed since. Its outcome is fenced again
        (:class:`WorkflowStepSupersededError`, nothing written); a value the
        database refuses is a :class:`StoreError`."""
        ...

    # --- sweep (each indexed, at most ``limit``) -----------------------------
    # Each finds only steps out of their sweep backoff (see note_steps_swept):
    # steps never re-sent first, oldest first, then re-sent ones by the end of
    # their backoff, so what the sweep just re-sent never fills its batch.
    def lapsed_steps(self, limit: int, bound_ms: int | None = None) -> list[StepState]:
        """Running steps whose lease lapsed, or ends beyond ``now + bound_ms``."""
        ...

    def undispatched_steps(self, older_than_ms: int, limit: int) -> list[StepState]:
        """pending/scheduled task steps whose message was sent (or due) longer ago
        than ``older_than_ms``: the message may be lost."""
        ...

    def due_steps(self, limit: int) -> list[StepState]:
        """Scheduled timers/signal timeouts and failed steps whose retry is due."""
        ...

    def idle_runs(self, idle_ms: int, limit: int) -> list[RunState]:
        """Running runs with no progress for ``idle_ms`` and no step in flight.

        Oldest first, as far as a bounded read finds them: a store may read
        candidates a window at a time and set a busy one (a step in flight)
        aside for ``idle_ms`` before it looks at it again, so a year of
        long-busy runs costs a window per call, not a scan; a run that goes
        idle while set aside is returned once its idle period is over."""
        ...

    def overdue_runs(self, limit: int) -> list[RunState]:
        """Running runs whose deadline passed on the store's clock, out of
        their sweep backoff, earliest deadline first."""
        ...

    def mark_blocked(self, run_id: str, reason: str) -> None:
        """Say why no pass can run a live run now (``RunState.blocked``);
        the next pass that runs clears it. Not a pass: bumps nothing."""
        ...

    def waiting_by_queue(self, older_than_ms: int) -> list[tuple[str | None, int, int]]:
        """``(queue, steps, oldest wait ms)`` of task steps sent (or due) longer
        ago than ``older_than_ms`` and still unclaimed: a queue here that stays
        here has no worker consuming it. Busiest queue first."""
        ...

    def note_steps_swept(
        self, step_ids: Sequence[str], backoff_ms: int, max_backoff_ms: int | None = None
    ) -> None:
        """Start each step's sweep backoff: the sweep's queries skip it for
        ``backoff_ms * 2 ** sweep_count`` (at most ``max_backoff_ms``), then
        find it behind the steps never re-sent. Per step, so a run's other
        steps are never held back by it."""
        ...

    def note_swept(self, run_id: str, backoff_ms: int, max_backoff_ms: int | None = None) -> bool:
        """Claim a sweep wake-up of the run unless one is already pending
        (``next_sweep_at`` in the future). Each wake-up with no pass in
        between doubles the wait before the next (``backoff_ms * 2 **
        sweep_count``, at most ``max_backoff_ms``); a pass resets it. True if
        the caller should wake the run."""
        ...


# --- what some stores can do besides (checked once, when the engine is built) ---
@runtime_checkable
class TransientErrors(Protocol):
    """A store that tells a passing failure (a lost connection) from a lasting one."""

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is worth retrying the call for."""
        ...


@runtime_checkable
class TransactionalSteps(Protocol):
    """A store whose steps' own writes can commit with their outcome."""

    def complete_in_transaction(
        self,
        step_id: str,
        attempt: int,
        body: Callable[[Any], JSON],
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> JSON:
        """Run ``body(connection)`` and the fenced success write in one transaction."""
        ...


class SettleWatch(Protocol):
    """One waiter's registration for the settle notice of one run."""

    def wait(self, timeout: float) -> None:
        """Return when a notice for the run came (or after ``timeout`` seconds)."""
        ...

    def settled(self) -> Settled | None:
        """How the run ended, if a notice came and carried it (else read the run)."""
        ...

    def heard_since(self, since: float) -> bool:
        """Whether every notice sent since ``since`` (``time.monotonic()``)
        reached this process: then a run created after it and not told
        settled has not settled, with no need to read it."""
        ...


class WaitOnly:
    """A settle watch that only waits (notices that carry nothing)."""

    def __init__(self, wait: Callable[[float], None]) -> None:
        self.wait = wait

    def settled(self) -> Settled | None:
        """Nothing carried: the waiter reads the run."""
        return None

    def heard_since(self, since: float) -> bool:
        """Never sure: the waiter reads the run."""
        return False


@runtime_checkable
class SettleNotices(Protocol):
    """A store that can tell a waiter the moment a run settles."""

    def settled_listener(self, run_id: str) -> AbstractContextManager[SettleWatch | None]:
        """Registered before the caller reads the run: its watch wakes when a
        pass settles it (None: no notices now; poll)."""
        ...


@runtime_checkable
class RunStarts(Protocol):
    """A store that can create a run and record its first pass in one write."""

    def start_view(self, new: NewRun, now: int) -> PassView | None:
        """The run ``new`` as it will be created at ``now`` (the store's clock
        as the engine last read it), for its first pass, with nothing read or
        written; None when this store cannot start it in one write (the
        caller creates it and takes the pass)."""
        ...

    def write_start(self, new: NewRun, read: PassView, plan: PassWrite) -> AdvanceResult | None:
        """Create the run and write ``plan``, its first pass, in one write;
        None, with nothing written, when the plan is more than the one write
        takes (the caller creates the run and takes the pass)."""
        ...


@runtime_checkable
class ValueCeiling(Protocol):
    """A store whose database refuses values above a size of its own."""

    def max_value_bytes(self) -> tuple[int, str] | None:
        """The largest JSON value one outcome write can carry, and what sets
        it (a server setting a user can raise); None when nothing lower than
        the engine's own limits applies."""
        ...


class StoreCapabilities:
    """What a store can do beyond the port, found once from its type."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self.starts = store if isinstance(store, RunStarts) else None
        self.transient = store if isinstance(store, TransientErrors) else None
        self.transactional = store if isinstance(store, TransactionalSteps) else None
        self.settle = store if isinstance(store, SettleNotices) else None
        self.values = store if isinstance(store, ValueCeiling) else None
        self.slots = store.concurrency_slots() if isinstance(store, HasConcurrencySlots) else None
