"""The one way pikku writes a time for a machine: ISO 8601 in UTC, to the
millisecond, with ``Z`` (``2026-12-02T14:37:24.123Z``).

The store keeps epoch milliseconds on the database's clock; every JSON
answer (the run page's API, the Flask and Django mounts, ``runs ... --json``)
spells them with :func:`iso`, so one run reads the same through each.
"""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC with ``Z`` (None stays None)."""
    if ms is None:
        return None
    when = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return when.removesuffix("+00:00") + "Z"
