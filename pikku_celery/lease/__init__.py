"""Leases: who may do a piece of work, until when, with a fencing token."""

from .base import TTL, Lease, LeaseService, ttl_millis, ttl_seconds
from .hold import HeldLease, hold_lease
from .memory import InMemoryLeaseService
from .redis import RedisLeaseService
from .sql import SQLLeaseService

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
