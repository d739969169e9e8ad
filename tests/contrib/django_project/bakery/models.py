"""An order, as the shop's own Django model."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """A customer's order; its workflow run is ``run_id``."""

    cents = models.IntegerField()
    run_id = models.CharField(max_length=64, blank=True)
