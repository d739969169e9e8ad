"""A run id checked at the boundary: a UUID, or a clear error naming the value."""

from __future__ import annotations

import uuid

from ..errors import InvalidRunIdError


def parse_run_id(run_id: str) -> str:
    """Refuse a malformed run id at the boundary, with the value shown."""
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise InvalidRunIdError(f"{run_id!r} is not a workflow run id (a UUID)") from None
