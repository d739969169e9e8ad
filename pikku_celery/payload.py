"""JSON payloads: checked at the boundary, with the offending value's path.

Inputs, step arguments and results travel and rest as JSON. A value that is
not JSON is refused before anything is written, naming where it sits
(``input['order']['when']``) so the user can find it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from .errors import PayloadError

DEFAULT_MAX_BYTES = 1_000_000


def _path_error(value: Any, path: str, where: str) -> PayloadError:
    return PayloadError(
        f"{where}: {path} is a {type(value).__name__}, which is not JSON "
        "(use str, int, float, bool, None, list or dict with str keys)"
    )


def check_json(value: Any, where: str, path: str = "value") -> None:
    """Raise :class:`PayloadError` naming the first non-JSON value's path."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{where}: {path} is {value!r}, which JSON cannot carry")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json(item, where, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{where}: {path} has key {key!r} of type {type(key).__name__}; "
                    "JSON object keys must be str"
                )
            check_json(item, where, f"{path}[{key!r}]")
        return
    raise _path_error(value, path, where)


def dumps(value: Any, where: str, path: str = "value", max_bytes: int | None = None) -> str:
    """Serialise ``value`` for storage, refusing non-JSON and oversized values."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        check_json(value, where, path)  # finds the path and raises
        raise  # pragma: no cover - check_json always raises here
    if "\\ud" in text:  # a character beyond the BMP, or a surrogate
        _refuse_surrogates(value, where, path)
    if max_bytes is not None and len(text) > max_bytes:
        raise PayloadError(
            f"{where}: {path} is {len(text)} bytes of JSON, above the limit of {max_bytes}"
        )
    return text


def _refuse_surrogates(value: Any, where: str, path: str) -> None:
    """Strings must be Unicode text: a surrogate code point has no UTF-8 form,
    and two of them in a row would come back as one character. (Escaped
    text cannot tell them from a character beyond the BMP, so look again.)"""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise PayloadError(
            f"{where}: {path} holds the surrogate code point {bad!r} in a string; "
            "strings must be valid Unicode text"
        ) from None


def loads(text: str | None) -> Any:
    """Decode a stored JSON payload; NULL stays None."""
    return None if text is None else json.loads(text)


@dataclass(frozen=True)
class UnreadableValue:
    """A stored payload that is not valid JSON (an edited row), kept as its text.

    Reads that show runs (``runs show``, handles) carry it so a person can see
    the bad value; a replay pass refuses it with :class:`CorruptValueError`.
    """

    text: str
    error: str
    where: str  # "run <id> column input", "run <id> step 'charge' column result"

    def __repr__(self) -> str:
        excerpt = self.text if len(self.text) <= 80 else self.text[:80] + "..."
        return f"<unreadable JSON in {self.where}: {excerpt!r} ({self.error})>"


def read_stored(text: str | None, where: str, *names: object) -> Any:
    """Decode a stored payload; invalid JSON becomes an :class:`UnreadableValue`
    instead of an exception, placed by ``where.format(*names)`` (its run, step
    and column: formatted only then, as this runs for every value read)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        return UnreadableValue(text, f"{type(exc).__name__}: {exc}", where.format(*names))


def normalise(value: Any, where: str, path: str = "value") -> Any:
    """The value as it will come back from storage (tuples become lists)."""
    return json.loads(dumps(value, where, path))
