"""The SQL store's reads for people: the run page, the command line, the deploy check."""

from __future__ import annotations

from collections.abc import Sequence

from ..model.cursor import COUNT_CAP
from ..model.values import (
    JSON,
    AttemptStatus,
    RunState,
    RunStatus,
    RunView,
    StepState,
    StepStatus,
)
from ..payload import read_stored
from ..sql.engines import READ_ONLY_OPTION
from .rows import (
    SIGNAL_PLACE,
    run_from,
    step_from,
    steps_from,
)
from .sql_base import SQLBase, _prepared


class SQLReads(SQLBase):
    """Reads for people, each a few statements however many runs there are."""

    # --- reads for people ----------------------------------------------------
    @_prepared
    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepState]]:
        found: dict[str, list[StepState]] = {}
        if not run_ids:
            return found
        with self._one() as conn:
            for row in conn.execute(self.statements.steps_of_runs, {"p_ids": list(run_ids)}):
                found.setdefault(row.run_id, []).append(step_from(row))
        return found

    @_prepared
    def count_runs_by_status(
        self,
        *,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        stmt = self.statements.count_runs(
            workflow is not None, since is not None, until is not None
        )
        params = {"p_workflow": workflow, "p_since": since, "p_until": until}
        counts = dict.fromkeys(RunStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(stmt, params):
                counts[RunStatus(status)] = int(n)
        return counts

    @_prepared
    def count_runs_capped(
        self,
        *,
        cap: int = COUNT_CAP,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        stmt = self.statements.count_runs_capped(
            workflow is not None, since is not None, until is not None
        )
        params = {"p_workflow": workflow, "p_since": since, "p_until": until, "p_cap": cap + 1}
        counts = dict.fromkeys(RunStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(stmt, params):
                counts[RunStatus(status)] = int(n)
        return counts

    @_prepared
    def runs_with_key(self, idempotency_key: str, limit: int = 50) -> list[RunState]:
        params = {"p_key": idempotency_key, "p_limit": limit}
        with self._one() as conn:
            return [run_from(r) for r in conn.execute(self.statements.runs_with_key, params)]

    @_prepared
    def get_signals(self, run_id: str) -> dict[str, JSON]:
        with self._one() as conn:
            rows = conn.execute(self.statements.signals_in_order, {"p_id": run_id})
            return {name: read_stored(text, SIGNAL_PLACE, run_id, name) for name, text in rows}

    @_prepared
    def count_steps_by_status(self) -> dict[StepStatus, int]:
        counts = dict.fromkeys(StepStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(self.statements.steps_by_status):
                counts[StepStatus(status)] = int(n)
        return counts

    @_prepared
    def count_attempts_by_status(self) -> dict[AttemptStatus, int]:
        counts = dict.fromkeys(AttemptStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(self.statements.attempts_by_status):
                counts[AttemptStatus(status)] = int(n)
        return counts

    @_prepared
    def in_flight_views(self, after_id: str | None = None, limit: int = 500) -> list[RunView]:
        st = self.statements
        # One read-only transaction: one snapshot where the database gives
        # one per transaction (SQLite, MySQL), and no write lock on SQLite.
        reader = self._engine.execution_options(**{READ_ONLY_OPTION: True})
        with reader.begin() as conn:
            now = int(conn.execute(st.now).scalar_one())
            params = {"p_after": after_id or "", "p_limit": limit}
            runs = [run_from(r) for r in conn.execute(st.in_flight_runs, params)]
            if not runs:
                return []
            ids = {"p_ids": [r.id for r in runs]}
            steps: dict[str, list[StepState]] = {r.id: [] for r in runs}
            for step in steps_from(conn.execute(st.steps_of_runs, ids)):
                steps[step.run_id].append(step)
            signals: dict[str, dict[str, JSON]] = {r.id: {} for r in runs}
            for run_id, name, text in conn.execute(st.signals_of_runs, ids):
                signals[run_id][name] = read_stored(text, SIGNAL_PLACE, run_id, name)
        return [RunView(run=r, steps=steps[r.id], signals=signals[r.id], now=now) for r in runs]
