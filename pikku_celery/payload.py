"""JSON payloads: checked at the boundary, with the offending value's path.

Inputs, step arguments and results travel and rest as JSON. A value that is
not JSON is refused before anything is written, naming where it sits
(``input['order']['when']``) so the user can find it.
"""

from __future__ import annotations

import json
import math
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
    if max_bytes is not None and len(text) > max_bytes:
        raise PayloadError(
            f"{where}: {path} is {len(text)} bytes of JSON, above the limit of {max_bytes}"
        )
    return text


def loads(text: str | None) -> Any:
    """Decode a stored JSON payload; NULL stays None."""
    return None if text is None else json.loads(text)


def normalise(value: Any, where: str, path: str = "value") -> Any:
    """The value as it will come back from storage (tuples become lists)."""
    return json.loads(dumps(value, where, path))
