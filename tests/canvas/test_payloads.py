"""A durable canvas carries what Celery's JSON serializer carries, on a real worker.

kombu's JSON round-trips bytes, datetimes, UUIDs and Decimals: a task gets
them as those types, passes them on, and the caller gets them back, as with
plain Celery.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

from celery import chain, group

from .cluster import CanvasCluster

VALUES = (b"\x00bytes\xff", datetime(2026, 12, 3, 6, 0, tzinfo=UTC), Decimal("1.10"), uuid.uuid4())


def test_bytes_datetimes_decimals_and_uuids_reach_the_task_and_come_back(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = group(
        app.signature("c.collect", args=VALUES, kwargs={"when": VALUES[1]}),
        app.signature("c.type_names", args=VALUES),
    )
    collected, names = c.app.pikku.durable(canvas).wait(timeout=30)
    assert collected == {"args": list(VALUES), "kwargs": {"when": VALUES[1]}}
    assert names == ["bytes", "datetime", "Decimal", "UUID"]
    plain = canvas.apply_async().get(timeout=30)  # plain Celery, the same worker
    assert [collected, names] == plain


def test_a_chain_passes_such_a_result_on_as_its_type(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chain(app.signature("c.add", args=(b"ab", b"cd")), app.signature("c.type_names"))
    assert c.app.pikku.durable(canvas).wait(timeout=30) == ["bytes"]
