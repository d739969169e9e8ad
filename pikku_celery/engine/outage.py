"""Riding out a store outage at the library's edge.

A database restart or a failover makes every statement fail for a few
seconds, then all is well again. A call made from outside a worker (start,
signal, cancel, a read, ``wait``, the page) should neither fail for that nor
leak the driver's exception: it calls again with backoff while its time
allows, then raises :class:`~pikku_celery.errors.StoreUnavailableError`,
the one error a caller needs to catch for "the store is away".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import StoreUnavailableError
from ..retry import RetryPolicy

if TYPE_CHECKING:
    from .core import WorkflowEngine

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_PAUSE = 0.05
MAX_PAUSE = 1.0
"""A restarted database accepts connections again within a second or two:
pauses stay short so the first call after it is back is not late."""


class _Outlasted(StoreUnavailableError):
    """An outage a call already waited out its time for: an outer call made
    of it does not wait again."""


def _passing(engine: WorkflowEngine, exc: BaseException) -> bool:
    return not isinstance(exc, _Outlasted) and engine.is_transient(exc)


def ride_out(
    engine: WorkflowEngine,
    call: Callable[[], T],
    what: str,
    within: float | None = None,
) -> T:
    """``call()``, called again through a store outage for up to ``within``
    seconds (default: the engine's ``outage_timeout``), then
    :class:`StoreUnavailableError` naming ``what`` failed. Other errors pass
    through at once."""
    budget = engine.outage_timeout if within is None else max(0.0, within)
    policy = RetryPolicy(within=budget, first_pause=FIRST_PAUSE, max_pause=MAX_PAUSE)
    began = time.monotonic()
    told: list[bool] = []

    def tell(exc: BaseException) -> None:
        if not told:  # once per call: an outage is one line in the log
            told.append(True)
            log.warning("%s: the store is unavailable, trying again: %s", what, first_line(exc))

    try:
        return policy.call(call, lambda exc: _passing(engine, exc), tell)
    except Exception as exc:
        if not _passing(engine, exc):
            raise
        raise unavailable(what, exc, time.monotonic() - began) from exc


def unavailable(what: str, exc: BaseException, waited: float) -> StoreUnavailableError:
    """The error a caller sees once an outage outlasted its time."""
    return _Outlasted(
        f"{what}: the workflow store is unavailable (tried for {waited:.1f} s): {first_line(exc)}"
    )


def first_line(exc: BaseException) -> str:
    """The driver's own message, first line (SQLAlchemy's adds the statement)."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return detail[0] if detail else type(exc).__name__
