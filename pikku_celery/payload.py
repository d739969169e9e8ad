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

DEFAULT_MAX_DEPTH = 100
"""How deeply lists and objects may nest in a value pikku takes.

A value nested deeper than the decoder's recursion allowance stores fine and
then fails every read with ``RecursionError``, deep inside a worker's stack:
the bound keeps every stored value readable wherever it is read.
"""


def _path_error(value: Any, path: str, where: str) -> PayloadError:
    return PayloadError(
        f"{where}: {path} is a {type(value).__name__}, which is not JSON "
        "(use str, int, float, bool, None, list or dict with str keys)"
    )


def check_json(
    value: Any, where: str, path: str = "value", max_depth: int = DEFAULT_MAX_DEPTH
) -> None:
    """Raise :class:`PayloadError` naming the first non-JSON value's path, or
    saying that ``path`` nests deeper than ``max_depth``."""
    _walk(value, where, path, 0, (path, max_depth))


def _walk(value: Any, where: str, path: str, depth: int, top: tuple[str, int]) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"{where}: {path} is {value!r}, which JSON cannot carry")
        return
    if isinstance(value, (list, tuple, dict)) and depth >= top[1]:
        raise too_deep(where, top[0], top[1])
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk(item, where, f"{path}[{i}]", depth + 1, top)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadError(
                    f"{where}: {path} has key {key!r} of type {type(key).__name__}; "
                    "JSON object keys must be str"
                )
            _walk(item, where, f"{path}[{key!r}]", depth + 1, top)
        return
    raise _path_error(value, path, where)


def too_deep(where: str, path: str, max_depth: int) -> PayloadError:
    """The refusal of a value nested deeper than ``max_depth``."""
    return PayloadError(
        f"{where}: {path} nests lists and objects more than {max_depth} deep "
        f"(the limit, max_payload_depth, is {max_depth})"
    )


def dumps(
    value: Any,
    where: str,
    path: str = "value",
    max_bytes: int | None = None,
    max_depth: int | None = None,
    limit_name: str = "max_input_bytes",
) -> str:
    """Serialise ``value`` for storage, refusing non-JSON, oversized values and
    (with ``max_depth``) values nested deeper than that. ``limit_name`` is the
    setting a user raises to take a larger value: the refusal names it."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        # Finds the path (or the depth) and raises; a value too deep for the
        # encoder is too deep for any reader.
        check_json(value, where, path, DEFAULT_MAX_DEPTH if max_depth is None else max_depth)
        raise too_deep(where, path, DEFAULT_MAX_DEPTH) from None
    if max_depth is not None and text.count("[") + text.count("{") > max_depth:
        check_json(value, where, path, max_depth)  # only a value with enough brackets
    if "\\ud" in text:  # a character beyond the BMP, or a surrogate
        _refuse_surrogates(value, where, path)
    if max_bytes is not None and len(text) > max_bytes:
        raise PayloadError(
            f"{where}: {path} is {len(text)} bytes of JSON, above the limit of "
            f"{max_bytes} ({limit_name})"
        )
    return text


def parse_json(raw: str | bytes) -> Any:
    """Decode JSON that came from outside (a request body): nesting too deep
    for the decoder is a ``ValueError`` like any other bad JSON, never a
    ``RecursionError`` that a server would answer with a 500."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("it nests lists and objects too deep to decode") from None


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
    """Decode a stored JSON payload that pikku has just encoded; NULL stays None."""
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
    except (ValueError, RecursionError) as exc:
        return UnreadableValue(text, f"{type(exc).__name__}: {exc}", where.format(*names))


def normalise(value: Any, where: str, path: str = "value") -> Any:
    """The value as it will come back from storage (tuples become lists)."""
    return json.loads(dumps(value, where, path))
