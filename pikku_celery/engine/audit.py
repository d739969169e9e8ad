"""What the audit trail keeps of an operator's action, beside who did it."""

from __future__ import annotations

from ..model.values import JSON, Operator

API_OPERATOR = Operator("api")
"""Who acts when the caller names nobody: a call of the Python API."""

MAX_KEPT_PAYLOAD = 2048
"""The most characters of a signal's payload (as JSON) its audit entry keeps
whole; a longer one is kept as its start and its size (the signal itself
keeps it whole)."""


def signal_details(name: str, payload: JSON, text: str) -> dict[str, JSON]:
    """The audit details of signal ``name`` whose payload is ``text`` as JSON."""
    if len(text) <= MAX_KEPT_PAYLOAD:
        return {"name": name, "payload": payload}
    return {
        "name": name,
        "payload_preview": text[:MAX_KEPT_PAYLOAD],
        "payload_chars": len(text),
    }
