"""Place an order: the row and, once it commits, its run."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from pikku_celery.contrib.django import start_on_commit

from .models import Order
from .workflows import bake_order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Create the order; its run starts when the transaction commits."""
    with transaction.atomic():
        order = Order.objects.create(cents=int(request.POST["cents"]))
        pending = start_on_commit(
            bake_order, {"id": order.pk, "cents": order.cents}, idempotency_key=f"o{order.pk}"
        )
        transaction.on_commit(
            lambda: Order.objects.filter(pk=order.pk).update(run_id=pending.run_id)
        )
    return JsonResponse({"order": order.pk})
