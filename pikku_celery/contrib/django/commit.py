"""``start_on_commit``: start a workflow only once the data it needs is committed.

pikku writes runs through its own connections, so a run started inside a
Django transaction would be visible to workers at once, and would stay even if
that transaction rolled back: a worker could look for an order row that is
not there yet, or never will be. Deferring the start to ``on_commit`` closes
both holes.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from ...engine.core import WorkflowEngine
from ...engine.deadline import run_timeout_ms
from ...engine.handle import RunHandle
from ...engine.workflow import Workflow
from ...errors import PayloadError
from ...model.values import JSON
from ...payload import dumps
from .conf import get_pikku


class PendingRun:
    """What :func:`start_on_commit` returns: the run, once the transaction commits.

    Until then ``handle`` is None. After a rollback it stays None for good:
    Django drops the callback and nothing is started.
    """

    def __init__(
        self,
        workflow: Workflow,
        input: JSON,
        idempotency_key: str | None,
        timeout: float | timedelta | None = None,
    ) -> None:
        self.workflow = workflow
        self.input = input
        self.idempotency_key = idempotency_key
        self.timeout = timeout
        self.handle: RunHandle | None = None

    @property
    def started(self) -> bool:
        """True once the transaction committed and the run was started."""
        return self.handle is not None

    @property
    def run_id(self) -> str:
        """The run's id; only known after commit."""
        if self.handle is None:
            raise RuntimeError(
                f"the run of {self.workflow.name!r} starts when the transaction commits; "
                "it has not committed (or it rolled back)"
            )
        return self.handle.run_id

    def start(self) -> RunHandle:
        """Start the run now (the ``on_commit`` callback); idempotent per PendingRun."""
        if self.handle is None:
            self.handle = self.workflow.start(
                self.input, idempotency_key=self.idempotency_key, timeout=self.timeout
            )
        return self.handle

    def __repr__(self) -> str:
        state = self.handle.run_id if self.handle else "pending commit"
        return f"<PendingRun {self.workflow.name} {state}>"


def start_on_commit(
    workflow: Workflow | str,
    input: JSON = None,
    *,
    idempotency_key: str | None = None,
    timeout: float | timedelta | None = None,
    using: str | None = None,
) -> PendingRun:
    """Start ``workflow`` when the current transaction on ``using`` commits.

    Outside a transaction (autocommit) it starts at once, as Django's
    ``on_commit`` does. An unknown workflow, non-JSON or oversized input and
    a bad idempotency key are refused here, while the transaction can still
    roll back, instead of after the commit. A workflow given by name is
    looked up in :func:`~pikku_celery.contrib.django.get_pikku`'s registry.

    If starting fails after the commit (pikku's database unreachable for
    longer than the engine's ``outage_timeout``: :class:`StoreUnavailableError`),
    the exception propagates from the commit, as any ``on_commit`` callback's
    does; the data is committed by then, so pass an ``idempotency_key``
    derived from it to make a later retry start the same run, not a second.
    ``timeout`` is :meth:`~pikku_celery.Pikku.start`'s: the run's deadline,
    counted from when it starts (after the commit).
    """
    engine: WorkflowEngine = workflow.engine if isinstance(workflow, Workflow) else get_pikku()
    wf = engine.registry.get(workflow)
    dumps(input, f"workflow {wf.name!r}", "input", engine.max_input_bytes)
    if idempotency_key is not None and not isinstance(idempotency_key, str):
        raise PayloadError(f"idempotency_key must be a str, got {type(idempotency_key).__name__}")
    if timeout is not None:
        run_timeout_ms(timeout)  # refused now, while the transaction can roll back
    pending = PendingRun(wf, input, idempotency_key, timeout)
    transaction.on_commit(pending.start, using=using)
    return pending
