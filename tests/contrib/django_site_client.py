"""Drive the example Django site with Django's test client; print what it saw as JSON.

Run by ``test_django_worker.py`` as ``python -m tests.contrib.django_site_client``
with ``PIKKU_DEMO_HOME`` set, while a real ``celery worker`` on the same home
works the shop's queues. It runs in a process of its own because the example
site's settings module cannot share a process with the Django settings that
``test_django.py`` configures.

Two orders are placed through the site's form view, each inside a transaction
of the caller's: the first transaction rolls back, the second commits. Then
the committed order's status page is polled until it shows the run completed.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import django

ORDER_FORM = {"cents": "4999", "country": "FI", "items": "2"}


class RolledBack(Exception):
    """Raised to leave the first order's transaction by rolling it back."""


def main() -> None:
    """Place the two orders, poll the status page, print the findings as JSON."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "example_project.django_site.settings"
    django.setup()

    from django.core.management import call_command
    from django.db import transaction
    from django.test import Client

    from example_project.django_site.orders.models import Order
    from pikku_celery.contrib.django import get_pikku
    from tests.helpers import wait_until

    call_command("migrate", verbosity=0, interactive=False)
    store = get_pikku().store
    client = Client()

    def run_ids() -> list[str]:
        return [run.id for run in store.list_runs(limit=1000)]

    report: dict[str, Any] = {"runs_at_start": run_ids()}

    # 1. The caller's transaction rolls back: no order row, no run.
    try:
        with transaction.atomic():
            response = client.post("/", ORDER_FORM)
            report["rolled_back"] = {
                "status_code": response.status_code,
                "location": response.headers.get("Location"),
                "orders_inside": Order.objects.count(),
                "runs_inside": run_ids(),
            }
            raise RolledBack
    except RolledBack:
        pass
    report["rolled_back"].update(orders_after=Order.objects.count(), runs_after=run_ids())

    # 2. The caller's transaction commits: the run starts then, and not before.
    with transaction.atomic():
        response = client.post("/", ORDER_FORM)
        runs_inside = run_ids()
    order = Order.objects.get()
    report["committed"] = {
        "status_code": response.status_code,
        "location": response.headers.get("Location"),
        "runs_inside": runs_inside,
        "runs_after": run_ids(),
        "order_pk": order.pk,
        "order_run_id": order.run_id,
    }

    # 3. The worker completes it; the status page shows it.
    pages: list[str] = []

    def completed_page() -> str | None:
        page = client.get(f"/orders/{order.pk}/")
        html = page.content.decode()
        pages.append(f"{page.status_code} {html}")
        return html if '<strong id="status">completed</strong>' in html else None

    try:
        report["page"] = wait_until(completed_page, timeout=90, interval=0.2)
    except AssertionError as exc:
        report["error"] = f"{exc}; last page:\n{pages[-1] if pages else '(none)'}"
    report["polls"] = len(pages)
    run = store.get_run(order.run_id) if order.run_id else None
    report["run"] = {"status": str(run.status), "output": run.output} if run else None
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
