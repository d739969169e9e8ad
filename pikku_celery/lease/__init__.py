"""Leases: who may do a piece of work, until when, with a fencing token."""

import importlib
from typing import TYPE_CHECKING, Any

from .base import TTL, Lease, LeaseService, ttl_millis, ttl_seconds
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


def __getattr__(name: str) -> Any:
    """The Redis and SQL services, on first use (PEP 562): importing the package
    loads neither Redis nor SQLAlchemy."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
