"""The bounds every run lives within, so no body can grow or spin without end.

A body is ordinary Python, replayed on every pass: a bug that records steps in
a loop, spawns children recursively or never suspends would otherwise fill the
database or hold a worker forever. Each bound has a default (see "Limits" in
docs/guide/workflows.md) and is set on ``Pikku(...)`` / ``WorkflowEngine(...)`` by its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..payload import DEFAULT_MAX_DEPTH

MAX_PAYLOAD_DEPTH_CEILING = 500
"""The deepest nesting the checks themselves can walk (they recurse)."""


@dataclass(frozen=True)
class Limits:
    """The bounds of a run and of one replay pass; each refuses with a clear error."""

    max_steps_per_run: int = 1_000
    """Steps a run may record (tasks, timers, signals, children, ``ctx.now()`` values)."""

    max_children_per_run: int = 100
    """Child runs one run may start."""

    max_child_depth: int = 16
    """How deep children of children may nest (a top-level run is depth 0)."""

    pass_max_seconds: float = 10.0
    """Wall time one replay pass may spend in the body before the run fails."""

    pass_max_calls: int = 100_000
    """``ctx`` calls one replay pass may make before the run fails."""

    max_payload_depth: int = DEFAULT_MAX_DEPTH
    """How deeply lists and objects may nest in an input, signal payload, step
    argument, step result or output."""

    max_result_bytes: int = 10_000_000
    """The largest step result, as compact JSON (the store's own ceiling may be lower)."""

    resume_max_bodies: int = 256
    """Parked bodies a worker thread holds for their runs' next passes (see
    :mod:`pikku_celery.engine.resume`); 0 replays every pass from the top."""

    resume_max_steps: int = 1_000_000
    """Recorded steps the parked bodies of a worker thread may index in all:
    the bound on their memory, which grows with the steps (and results) they hold."""

    def __post_init__(self) -> None:
        for name in ("resume_max_bodies", "resume_max_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for name in (
            "max_steps_per_run",
            "max_children_per_run",
            "pass_max_calls",
            "max_result_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.max_child_depth, int) or self.max_child_depth < 0:
            raise ValueError(f"max_child_depth must be an int >= 0, got {self.max_child_depth!r}")
        depth = self.max_payload_depth
        if not isinstance(depth, int) or not 1 <= depth <= MAX_PAYLOAD_DEPTH_CEILING:
            raise ValueError(
                f"max_payload_depth must be an int from 1 to {MAX_PAYLOAD_DEPTH_CEILING}, "
                f"got {depth!r}"
            )
        if not self.pass_max_seconds > 0:
            raise ValueError(f"pass_max_seconds must be > 0, got {self.pass_max_seconds!r}")


class PassBudgetSpent(BaseException):
    """Ends a pass whose body ran past its budget.

    A BaseException, like the pass's own suspension, so a body's ``except
    Exception`` cannot swallow it and loop on.
    """
