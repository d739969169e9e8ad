"""Durable canvas gives what plain Celery gives: the same canvas run both ways.

Each shape runs as plain Celery canvas (real worker, Redis broker, Redis
result backend: ``apply_async().get()``) and as a durable run (the same
worker, PostgreSQL store: ``pikku.durable(...).wait()``). Results, errors
(type and message, ids masked) and what links and errbacks were called with
must be identical. The test prints the table.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from celery import chain, chord, group
from celery.canvas import Signature

from .cluster import CanvasCluster

pytestmark = pytest.mark.slow

QUEUES: list[str] = []  # the cluster's queues (a worker consumes both)

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Shape:
    name: str
    build: Callable[[Callable[..., Signature], Callable[..., Signature], str], Any]
    """``build(s, si, tag)``: the canvas, ``s``/``si`` making signatures by task name."""
    records: tuple[str, ...] = ()
    """Record tags (suffixes of ``tag``) whose contents are compared too."""


def _shapes() -> list[Shape]:
    return [
        Shape("one task", lambda s, si, t: s("c.add", 2, 3)),
        Shape(
            "plain chain", lambda s, si, t: chain(s("c.add", 1, 2), s("c.add", 3), s("c.add", 4))
        ),
        Shape(
            "chain of .si()",
            lambda s, si, t: chain(si("c.add", 1, 1), si("c.add", 2, 2), si("c.add", 3, 3)),
        ),
        Shape(
            "chain .s() then .si() then .s()",
            lambda s, si, t: chain(s("c.add", 1, 1), si("c.add", 10, 10), s("c.mul", 3)),
        ),
        Shape("group", lambda s, si, t: group(s("c.add", i, i) for i in range(4))),
        Shape(
            "chord",
            lambda s, si, t: chord(
                [s("c.add", 1, 1), s("c.add", 2, 2), s("c.add", 3, 3)], s("c.tsum")
            ),
        ),
        Shape(
            "chord of chains",
            lambda s, si, t: chord(
                [chain(s("c.add", 1, 1), s("c.add", 1)), chain(s("c.add", 2, 2), s("c.mul", 3))],
                s("c.tsum"),
            ),
        ),
        Shape(
            "chain ending in a group",
            lambda s, si, t: chain(s("c.add", 1, 1), group(s("c.add", 1), s("c.mul", 5))),
        ),
        Shape(
            "group of chords",
            lambda s, si, t: group(
                chord([s("c.add", 1, 1), s("c.add", 2, 2)], s("c.tsum")),
                chord([s("c.add", 3, 3), s("c.add", 4, 4)], s("c.tsum", 100)),
            ),
        ),
        Shape(
            "nested chains in a group",
            lambda s, si, t: group(
                chain(s("c.add", 1, 1), s("c.add", 1)),
                chain(s("c.add", 2, 2), s("c.add", 2), s("c.mul", 2)),
                s("c.add", 9, 9),
            ),
        ),
        Shape(
            "group in a chain then a task (chord upgrade)",
            lambda s, si, t: chain(
                s("c.add", 1, 1), group(s("c.add", 1), s("c.add", 2)), s("c.tsum")
            ),
        ),
        Shape(
            "chain into a chord into a task",
            lambda s, si, t: chain(
                s("c.add", 1, 1),
                chord([s("c.add", 1), s("c.mul", 2)], s("c.tsum")),
                s("c.add", 100),
            ),
        ),
        Shape(
            "chord with a chain body",
            lambda s, si, t: chord(
                [s("c.add", 1, 1), s("c.add", 2, 2)], chain(s("c.tsum"), s("c.mul", 10))
            ),
        ),
        Shape(
            "nested group (flattened)",
            lambda s, si, t: group(group(s("c.add", 1, 1), s("c.add", 2, 2)), s("c.add", 3, 3)),
        ),
        Shape(
            "group then group in a chain",
            lambda s, si, t: chain(
                group(s("c.add", 1, 1), s("c.add", 2, 2)), group(s("c.tsum"), s("c.tsum", 10))
            ),
        ),
        Shape(
            "one-member group in a chain (unrolled)",
            lambda s, si, t: chain(s("c.add", 1, 1), group(s("c.add", 1)), s("c.mul", 10)),
        ),
        Shape(
            "chord with an immutable body",
            lambda s, si, t: chord([s("c.add", 1, 1), s("c.add", 2, 2)], si("c.add", 7, 7)),
        ),
        Shape(
            ".si() and .s() members of a group after a task",
            lambda s, si, t: chain(s("c.add", 1, 1), group(si("c.add", 5, 5), s("c.add", 1))),
        ),
        Shape(
            "args and kwargs partials",
            lambda s, si, t: chain(
                s("c.add", 2, 3), s("c.collect", 7, flag=True), s("c.collect", 8, last="yes")
            ),
        ),
        Shape(
            "kwargs-only partial",
            lambda s, si, t: chain(s("c.add", 1, 2), s("c.add", y=10)),
        ),
        Shape(
            "link",
            lambda s, si, t: s("c.add", 2, 2).set(link=s("c.record", f"{t}:link")),
            records=("link",),
        ),
        Shape(
            "immutable link on a chain member",
            lambda s, si, t: chain(
                s("c.add", 1, 1).set(link=si("c.record", "linked", f"{t}:link")), s("c.add", 5)
            ),
            records=("link",),
        ),
        Shape(
            "link_error (new style: request, exc, traceback)",
            lambda s, si, t: s("c.boom", 1).on_error(s("c.record_new_errback", f"{t}:err")),
            records=("err",),
        ),
        Shape(
            "link_error (old style: task id)",
            lambda s, si, t: s("c.boom", 2).on_error(s("c.record_old_errback", f"{t}:err")),
            records=("err",),
        ),
        Shape(
            "an errback that raises, then another",
            lambda s, si, t: (
                s("c.boom", 9)
                .on_error(s("c.raising_errback", f"{t}:err"))
                .on_error(s("c.record_old_errback", f"{t}:err"))
            ),
            records=("err",),
        ),
        Shape(
            "failure stops a chain",
            lambda s, si, t: chain(
                s("c.add", 1, 1), s("c.boom"), s("c.record", f"{t}:after")
            ).on_error(s("c.record_new_errback", f"{t}:err")),
            records=("after", "err"),
        ),
        Shape(
            "a KeyError in a chain",
            lambda s, si, t: chain(s("c.add", 1, 1), si("c.missing", "sku-9")),
        ),
        Shape(
            "arguments a task cannot take (Celery's typing check)",
            lambda s, si, t: chain(s("c.add", 1, 1), s("c.missing", "sku-9")),
        ),
        Shape(
            "failing member of a group",
            lambda s, si, t: group(s("c.add", 1, 1), s("c.boom", 3), s("c.add", 2, 2)),
        ),
        Shape(
            "failing member in a group under a chord",
            lambda s, si, t: chord(
                [s("c.add", 1, 1), s("c.boom", 4)],
                s("c.tsum").on_error(s("c.record_new_errback", f"{t}:err")),
            ),
            records=("err",),
        ),
        Shape(
            "failing chord header, errback on a chain body",
            lambda s, si, t: chord(
                [s("c.boom", 7), s("c.add", 1, 1)],
                chain(s("c.tsum"), s("c.add", 1)).on_error(s("c.record_new_errback", f"{t}:err")),
            ),
            records=("err",),
        ),
        Shape(
            "failing chord header, errbacks on a group body",
            lambda s, si, t: chord(
                [s("c.boom", 8), s("c.add", 1, 1)],
                group(
                    s("c.tsum").on_error(s("c.record_new_errback", f"{t}:err")),
                    s("c.tsum", 1).on_error(s("c.record_old_errback", f"{t}:err")),
                ),
            ),
            records=("err",),
        ),
        Shape(
            "failing chain in a chord header, then a task",
            lambda s, si, t: chain(
                chord([chain(s("c.add", 1, 1), s("c.boom")), s("c.add", 2, 2)], s("c.tsum")),
                s("c.record", f"{t}:after"),
            ),
            records=("after",),
        ),
        Shape(
            "a retried node (autoretry_for)",
            lambda s, si, t: chain(s("c.flaky", 5, f"{t}:tries", 2), s("c.add", 1)),
            records=("tries",),
        ),
        Shape(
            "link on a chain (its last task)",
            lambda s, si, t: chain(s("c.add", 1, 1), s("c.add", 1)).set(
                link=s("c.record", f"{t}:link")
            ),
            records=("link",),
        ),
        Shape(
            "link on a group (first member, immutable)",
            lambda s, si, t: _linked(
                group(s("c.add", 1, 1), s("c.add", 2, 2)), si("c.record", "g", f"{t}:link")
            ),
            records=("link",),
        ),
        Shape(
            "link_error on a group (every member)",
            lambda s, si, t: _erred(
                group(s("c.boom", 5), s("c.add", 2, 2), s("c.boom", 6)),
                s("c.record_new_errback", f"{t}:err"),
            ),
            records=("err",),
        ),
        Shape(
            "link_error on a chord (its body)",
            lambda s, si, t: _erred(
                chord([s("c.add", 1, 1), s("c.add", 2, 2)], s("c.boom")),
                s("c.record_new_errback", f"{t}:err"),
            ),
            records=("err",),
        ),
        Shape(
            "chord in a chord header",
            lambda s, si, t: chord(
                [chord([s("c.add", 1, 1), s("c.add", 2, 2)], s("c.tsum")), s("c.add", 3, 3)],
                s("c.tsum"),
            ),
        ),
        Shape(
            "link that is a chain",
            lambda s, si, t: s("c.add", 1, 1).set(
                link=chain(s("c.add", 10), s("c.record", f"{t}:link"))
            ),
            records=("link",),
        ),
        Shape(
            "queue, routing_key and priority options",
            lambda s, si, t: chain(
                s("c.add", 1, 1).set(queue=QUEUES[1], priority=3),
                s("c.add", 2).set(queue=QUEUES[0], routing_key=QUEUES[0]),
            ),
        ),
        Shape(
            "countdown",
            lambda s, si, t: chain(s("c.add", 1, 2).set(countdown=1), s("c.add", 1)),
        ),
    ]


def _quiet(read: Callable[[], Any], seconds: float, timeout: float = 20.0) -> None:
    """Poll ``read`` until its value has not changed for ``seconds``."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < seconds:
        time.sleep(0.05)  # polling a value that must stop changing
        now = read()
        if now != last:
            last, since = now, time.monotonic()


def _linked(sig: Signature, link: Signature) -> Signature:
    sig.link(link)
    return sig


def _erred(sig: Signature, errback: Signature) -> Signature:
    sig.link_error(errback)
    return sig


def _shown(outcome: Callable[[], Any]) -> str:
    try:
        value = outcome()
    except Exception as exc:
        return f"raises {type(exc).__name__}: {UUID.sub('<id>', str(exc))}"
    return json.dumps(value)


def _records(cluster: CanvasCluster, tag: str, shape: Shape) -> dict[str, list[Any]]:
    """What each record tag holds, in a stable order (group members' errbacks
    run concurrently, in either system)."""
    return {
        r: sorted(cluster.recorded(f"{tag}:{r}"), key=json.dumps)
        if r == "err"
        else cluster.recorded(f"{tag}:{r}")
        for r in shape.records
    }


def test_each_canvas_shape_gives_what_plain_celery_gives(
    canvas_cluster: CanvasCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    app = canvas_cluster.app.app
    QUEUES[:] = canvas_cluster.app.queues

    def s(name: str, *args: Any, **kwargs: Any) -> Signature:
        return app.signature(name, args=args, kwargs=kwargs)

    def si(name: str, *args: Any, **kwargs: Any) -> Signature:
        return app.signature(name, args=args, kwargs=kwargs, immutable=True)

    rows = [_row(canvas_cluster, s, si, shape, i) for i, shape in enumerate(_shapes())]
    table = _table(rows)
    with capsys.disabled():
        print("\n" + table)
    assert len(rows) >= 20
    assert all(same for *_, same in rows), table


def _row(
    cluster: CanvasCluster,
    s: Callable[..., Signature],
    si: Callable[..., Signature],
    shape: Shape,
    index: int,
) -> tuple[str, str, str, bool]:
    """One shape run both ways: its name, both outcomes, whether they agree."""
    plain_tag, durable_tag = f"p{index}", f"d{index}"
    plain = _shown(lambda: shape.build(s, si, plain_tag).apply_async().get(timeout=60))
    try:
        durable = _shown(
            lambda: cluster.app.pikku.durable(shape.build(s, si, durable_tag)).wait(60)
        )
    except Exception:
        print(cluster.logs())
        raise
    if shape.records:
        # Celery sends old-style errbacks and links as messages of their own
        # (and may call a chord's errbacks after its result is stored): wait
        # until Celery's records stay the same for a second. A durable run
        # settles only after its links and errbacks.
        _quiet(lambda: _records(cluster, plain_tag, shape), seconds=1.0)
        plain += "  records " + UUID.sub("<id>", json.dumps(_records(cluster, plain_tag, shape)))
        durable += "  records " + UUID.sub(
            "<id>", json.dumps(_records(cluster, durable_tag, shape))
        )
    return shape.name, plain, durable, plain == durable


def _table(rows: list[tuple[str, str, str, bool]]) -> str:
    width = max(len(r[0]) for r in rows)
    lines = [f"{'shape'.ljust(width)} | same | Celery result | durable result"]
    lines.append("-" * len(lines[0]))
    for name, plain, durable, same in rows:
        lines.append(f"{name.ljust(width)} | {'yes ' if same else 'NO  '} | {plain} | {durable}")
    return "\n".join(lines)
