"""Canvas payloads as Celery's JSON serializer carries them.

Celery's ``json`` serializer (kombu's) round-trips ``bytes``, ``datetime``,
``date``, ``time``, ``UUID`` and ``Decimal`` as tagged objects
(``{"__type__": "bytes", "__value__": ...}``). A canvas node's arguments and
result are stored in that tagged form, which is plain JSON, and given to the
task (or back to the caller) decoded, so a canvas that ran under plain
Celery runs durably with the same values.
"""

from __future__ import annotations

import json
from typing import Any

from celery.result import ResultBase
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads


def encoded(value: Any) -> Any:
    """``value`` in kombu's tagged JSON form; unchanged if kombu cannot encode
    it (the JSON check that follows names what is wrong). A result object
    (``AsyncResult``, ``GroupResult``) a task returns is its ``as_tuple()``,
    as Celery's result backend stores it."""
    if isinstance(value, ResultBase):
        value = value.as_tuple()
    try:
        return json.loads(kombu_dumps(value))  # type: ignore[no-untyped-call]
    except (TypeError, ValueError):
        return value


def decoded(value: Any) -> Any:
    """``value`` with kombu's tagged objects made Python values again."""
    if not _tagged(value):
        return value
    return kombu_loads(json.dumps(value))  # type: ignore[no-untyped-call]


def _tagged(value: Any) -> bool:
    if isinstance(value, dict):
        return "__type__" in value or any(_tagged(v) for v in value.values())
    if isinstance(value, list):
        return any(_tagged(v) for v in value)
    return False


def exception_details(exc: BaseException) -> dict[str, Any]:
    """``{"args": ...}``: the exception's arguments in kombu's JSON form, so
    it is rebuilt with all of them (as Celery's result backend rebuilds it);
    empty when they are not JSON."""
    args = encoded(list(exc.args))
    try:
        json.dumps(args)
    except (TypeError, ValueError):
        return {}
    return {"args": args}
