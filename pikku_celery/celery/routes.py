"""Where a step's message goes: the step task's whole Celery route.

A step travels as pikku's run-step task, but through the route its own task
would take: ``task_routes`` and routers, and the ``queue`` / ``exchange`` /
``routing_key`` / ``priority`` given to ``ctx.step``. The queue it lands on
decides its lease; a route by exchange and routing key names no queue, so the
queue is found among ``task_queues`` by the exchange's binding rules.
"""

from __future__ import annotations

from typing import Any

ROUTING_OPTIONS = ("queue", "exchange", "routing_key", "priority")
"""A task's options that route its messages (its own, or ``ctx.step``'s)."""


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic binding rules: words split on ``.``, ``*`` is one word, ``#`` any number."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        head, rest = p[0], p[1:]
        if head == "#":
            return any(match(rest, k[i:]) for i in range(len(k) + 1))
        if not k:
            return False
        return (head == "*" or head == k[0]) and match(rest, k[1:])

    return match(pattern.split("."), key.split("."))


def _binds(exchange_type: str, binding_key: str | None, routing_key: str | None) -> bool:
    if exchange_type == "fanout":
        return True
    if exchange_type == "topic":
        return topic_matches(binding_key or "", routing_key or "")
    return (binding_key or "") == (routing_key or "")  # direct (and headers: by key, a guess)


def _name(value: Any) -> str | None:
    name = getattr(value, "name", value)
    return str(name) if name else None


def routed_queue(task_queues: Any, route: dict[str, Any]) -> str | None:
    """The queue a message sent with Celery route ``route`` lands on, if known.

    ``route['queue']`` when the route names one and no other exchange; else
    the first of ``task_queues`` bound to the route's exchange with a binding
    key that matches its routing key; else None (the broker knows, this app
    does not).
    """
    queue = route.get("queue")
    exchange = _name(route.get("exchange"))
    queue_exchange = _name(getattr(queue, "exchange", None))
    # An explicit exchange other than the queue's own routes past that queue
    # (Celery sends to the exchange given), so its bindings decide.
    if queue is not None and (exchange is None or exchange == queue_exchange):
        return _name(queue)
    if exchange is None:
        return None
    routing_key = route.get("routing_key")
    for q in task_queues or ():
        bindings = [(q.exchange, q.routing_key)] if q.exchange is not None else []
        bindings += [(b.exchange, b.routing_key) for b in getattr(q, "bindings", None) or ()]
        for bound, key in bindings:
            if _name(bound) == exchange and _binds(
                getattr(bound, "type", "direct") or "direct", key, routing_key
            ):
                return str(q.name)
    return None
