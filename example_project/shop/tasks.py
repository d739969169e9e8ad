"""Ordinary Celery tasks: pikku runs them as workflow steps, unchanged.

Shared tasks (``@shared_task``), as Celery suggests for a module of reusable
tasks: the shop's app has them, and so does any other app in the process,
such as the one a pytest-celery setup makes (``tests/test_on_workers.py``).

Their misbehaviour is scripted by order id, so the demo shows every path:
a card network that is busy at first, a courier that never comes, and a
parcel packer whose worker is killed half-way.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task

from example_project.app import HOME

KILL_MARK = HOME / "kill-me.pid"


@shared_task(name="shop.charge_card", bind=True)
def charge_card(self: Any, order_id: int, cents: int, idempotency_key: str) -> dict[str, Any]:
    """Charge the card. The card network is 'busy' on the first try of even orders."""
    if order_id % 2 == 0 and self.request.retries == 0:
        raise ConnectionError("card network busy, try again")
    time.sleep(0.05)
    return {"charge_id": f"ch_{idempotency_key[:8]}", "cents": cents}


@shared_task(name="shop.reserve_stock")
def reserve_stock(order_id: int, sku: str, qty: int) -> dict[str, Any]:
    """Reserve one line item (the workflow reserves all lines in parallel)."""
    time.sleep(0.02 * qty)
    return {"sku": sku, "qty": qty, "bin": f"B-{abs(hash(sku)) % 100:02d}"}


@shared_task(name="shop.pack_parcel", bind=True)
def pack_parcel(self: Any, order_id: int, kill_order: int) -> str:
    """Pack the parcel. For ``kill_order`` the first attempt hangs and the demo
    SIGKILLs its worker process: attempt 2, on another process, finishes it."""
    if order_id == kill_order and self.request.retries == 0:
        KILL_MARK.write_text(str(os.getpid()))
        time.sleep(600)  # never finishes: the demo kills this process
    return f"parcel-{order_id}"


@shared_task(name="shop.create_label")
def create_label(order_id: int) -> str:
    """Print the shipping label (runs on the 'shipping' queue)."""
    return f"LBL-{order_id:05d}"


@shared_task(name="shop.book_courier")
def book_courier(order_id: int, country: str) -> str:
    """Book the courier; nobody delivers to Antarctica, ever."""
    if country == "AQ":
        raise RuntimeError(f"no courier delivers to {country}")
    return f"courier booked for order {order_id}"


@shared_task(name="shop.refund")
def refund(order_id: int, charge_id: str, cents: int) -> dict[str, Any]:
    """Give the money back: the compensation when an order cannot be shipped."""
    return {"refunded": cents, "charge_id": charge_id}
