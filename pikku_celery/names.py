"""Names and keys checked at the boundary: what every SQL dialect can store exactly.

Step names, signal names, idempotency keys, workflow and task names land in
``VARCHAR(255)`` columns compared byte for byte. A value a database would
refuse (a NUL on PostgreSQL), mangle (a lone surrogate has no UTF-8 form) or
cut is refused here, before anything is written, so a run never half-exists
because one of its names could not be stored.
"""

from __future__ import annotations

import uuid
from typing import Any

from .errors import InvalidIdError, PayloadError

MAX_NAME_LENGTH = 255
"""Characters in a stored name (the ``VARCHAR`` length of every name column)."""

SIGNAL_PREFIX = "signal:"
"""A signal's wait is recorded as the step ``signal:<name>``."""

MAX_SIGNAL_NAME_LENGTH = MAX_NAME_LENGTH - len(SIGNAL_PREFIX)

PATCH_PREFIX = "patch:"
"""``ctx.patched(id)`` records its marker as the value step ``patch:<id>``."""

MAX_PATCH_ID_LENGTH = MAX_NAME_LENGTH - len(PATCH_PREFIX)

EVENT_PREFIX = "event:"
"""``ctx.set_event(key, value)`` records the value step ``event:<key>#<n>``,
``n`` counting the run's earlier events of that key from 0."""

MAX_EVENT_KEY_LENGTH = MAX_NAME_LENGTH - len(EVENT_PREFIX) - len("#") - 7
"""An event key leaves room for its prefix and a number of seven digits."""


def check_name(value: Any, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """Return ``value`` if it is a storable name, else raise :class:`PayloadError`.

    ``what`` says where it came from (``"step name"``, ``"idempotency key"``)
    and leads the message.
    """
    if not isinstance(value, str):
        raise PayloadError(f"{what} must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise PayloadError(f"{what} must not be empty")
    if len(value) > max_length:
        raise PayloadError(
            f"{what} is {len(value)} characters long, above the limit of {max_length}: "
            f"{value[:40]!r}..."
        )
    if "\x00" in value:
        raise PayloadError(f"{what} contains a NUL character, which no database stores: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(
            f"{what} contains {value[exc.start : exc.end]!r} at {exc.start}, a lone surrogate "
            f"with no UTF-8 form: {value!r}"
        ) from None
    return value


def check_id(value: Any, what: str) -> str:
    """Return ``value`` as the canonical text of a UUID, else raise :class:`InvalidIdError`.

    Ids arrive in messages anyone on the broker can send; one that is not a
    UUID string never reaches SQL (MariaDB would compare ``44`` with
    ``'044d...'`` as numbers and match).
    """
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be a UUID string, got {type(value).__name__} {value!r}")
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidIdError(f"{what} {value[:80]!r} is not a UUID") from None
