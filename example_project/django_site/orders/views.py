"""Place an order (its workflow starts when the order commits) and watch it run."""

from __future__ import annotations

import contextlib

from django import forms
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from example_project.shop.workflows import LARGE_ORDER_CENTS, fulfil_order
from pikku_celery import RunNotFoundError, RunSettledError
from pikku_celery.contrib.django import get_pikku, start_on_commit
from pikku_celery.contrib.summary import run_summary

from .models import Order

COUNTRIES = [
    ("FI", "Finland"),
    ("SE", "Sweden"),
    ("AQ", "Antarctica (no courier goes there: the order is refunded)"),
]


class OrderForm(forms.Form):
    """What the customer orders."""

    cents = forms.IntegerField(
        min_value=100,
        max_value=1_000_000,
        initial=4999,
        help_text=f"{LARGE_ORDER_CENTS} or more waits for approval",
    )
    country = forms.ChoiceField(choices=COUNTRIES)
    items = forms.IntegerField(min_value=1, max_value=3, initial=2, help_text="line items, 1-3")


def index(request: HttpRequest) -> HttpResponse:
    """The order form and the latest orders; a valid POST places an order."""
    form = OrderForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            order = Order.objects.create(**form.cleaned_data)
            # Not started yet: a worker must never see a run whose order row
            # could still roll back. It starts when this block commits.
            pending = start_on_commit(
                fulfil_order, order.workflow_input(), idempotency_key=order.idempotency_key
            )
            # Also on commit, after the start (callbacks run in order): this block
            # may be nested in an outer transaction (ATOMIC_REQUESTS, a caller's).
            transaction.on_commit(
                lambda: Order.objects.filter(pk=order.pk).update(run_id=pending.run_id)
            )
        return redirect("order", pk=order.pk)
    orders = Order.objects.all()[:20]
    return render(request, "orders/index.html", {"form": form, "orders": orders})


def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The order's run: status, output or error, each step with its attempts."""
    order = get_object_or_404(Order, pk=pk)
    run = None
    if order.run_id:
        try:
            run = run_summary(get_pikku().handle(order.run_id))
        except RunNotFoundError:
            run = None  # the shop's database was reset under the site
    awaiting_approval = bool(
        run
        and not run["terminal"]
        and any(
            s["kind"] == "signal" and s["status"] not in ("succeeded", "failed")
            for s in run["steps"]
        )
    )
    context = {"order": order, "run": run, "awaiting_approval": awaiting_approval}
    return render(request, "orders/detail.html", context)


@require_POST
def approve(request: HttpRequest, pk: int) -> HttpResponse:
    """Send the ``approval`` signal a large order waits for."""
    order = get_object_or_404(Order, pk=pk)
    if order.run_id:
        approved = request.POST.get("decision") == "approve"
        # A run that timed out or was decided already refuses it; the page shows which.
        with contextlib.suppress(RunSettledError):
            get_pikku().send_signal(
                order.run_id, "approval", {"approved": approved, "by": "django-example"}
            )
    return redirect("order", pk=order.pk)
