"""Celery integration: the Pikku class, its tasks, and leases per queue."""

from .dispatcher import ORCHESTRATE, RUN_STEP, SWEEP, CeleryDispatcher
from .integration import Pikku
from .queues import QueueLease, QueueLeases

__all__ = [
    "ORCHESTRATE",
    "RUN_STEP",
    "SWEEP",
    "CeleryDispatcher",
    "Pikku",
    "QueueLease",
    "QueueLeases",
]
