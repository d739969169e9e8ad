"""A step's own request fields (its route's extras), applied as Celery applies them.

A canvas node carries what Celery would have given its task's request:
``root_id`` and ``parent_id`` as the canvas sets them, and the stamps of
Celery's stamping API. The engine keeps them with the step without reading
them (:data:`~pikku_celery.engine.task_id.EXTRAS`); here they become the
fields of the request the task body sees, eager or not, and the options of
the step's message, so ``task_received`` and ``before_task_publish``
handlers see the stamps in its headers, as they would on Celery's own.
"""

from __future__ import annotations

from typing import Any

from ..engine.task_id import EXTRAS

ID_FIELDS = ("root_id", "parent_id")
STAMPS = "stamps"
"""The extras key holding a node's stamps (header name to value)."""


def extras_of(route: dict[str, Any] | None) -> dict[str, Any]:
    """The extras a step's route holds (empty when it holds none, or not a mapping)."""
    found = (route or {}).get(EXTRAS)
    return found if isinstance(found, dict) else {}


def stamps_of(extras: dict[str, Any]) -> dict[str, Any]:
    """A step's stamps: header name to value."""
    stamps = extras.get(STAMPS)
    return dict(stamps) if isinstance(stamps, dict) else {}


def request_fields(route: dict[str, Any] | None) -> dict[str, Any]:
    """The request fields of a step's extras, for ``task.push_request``:
    its ids (a None parent: the caller started it), and its stamps as a
    worker's request has them."""
    extras = extras_of(route)
    fields = {key: extras[key] for key in ID_FIELDS if key in extras}
    stamps = stamps_of(extras)
    if stamps:
        fields["stamped_headers"] = list(stamps)
        fields["stamps"] = stamps
    return fields


def message_options(route: dict[str, Any] | None) -> dict[str, Any]:
    """The ``send_task`` options of a step's extras: its ids and stamps
    travel in the step's message headers, as ``apply_async`` sends them."""
    extras = extras_of(route)
    options = {key: extras[key] for key in ID_FIELDS if isinstance(extras.get(key), str)}
    stamps = stamps_of(extras)
    if stamps:
        options["stamped_headers"] = list(stamps)
        options.update(stamps)
    return options
