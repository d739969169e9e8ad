"""An order row, written in the same transaction that asks for its workflow."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models


class Order(models.Model):
    """What the customer asked for, and the workflow run fulfilling it."""

    reference = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    cents = models.PositiveIntegerField()
    country = models.CharField(max_length=2)
    items = models.PositiveSmallIntegerField(default=1)
    run_id = models.CharField(max_length=36, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"order {self.pk}"

    def workflow_input(self) -> dict[str, Any]:
        """The input of ``shop.fulfil_order`` (see example_project/shop/workflows.py)."""
        return {
            "id": self.pk,
            "cents": self.cents,
            "country": self.country,
            "lines": [{"sku": f"SKU-{self.pk}-{k}", "qty": k + 1} for k in range(self.items)],
            "cooling_off": 1.0,
            "approval_timeout": 300,  # large orders wait for the approval buttons
        }

    @property
    def idempotency_key(self) -> str:
        """Derived from the order, so a retried start finds the same run."""
        return f"django-order-{self.reference}"
