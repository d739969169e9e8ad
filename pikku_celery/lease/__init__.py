"""Leases: who may do a piece of work, until when, with a fencing token."""

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes
from ..ports.lease import TTL, Lease, LeaseService, ttl_millis, ttl_seconds
from .hold import HeldLease, hold_lease
from .memory import InMemoryLeaseService

if TYPE_CHECKING:
    from .redis import RedisLeaseService
    from .sql import SQLLeaseService

_LAZY = {"RedisLeaseService": ".redis", "SQLLeaseService": ".sql"}

__all__ = [
    "TTL",
    "HeldLease",
    "InMemoryLeaseService",
    "Lease",
    "LeaseService",
    "RedisLeaseService",
    "SQLLeaseService",
    "hold_lease",
    "ttl_millis",
    "ttl_seconds",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
