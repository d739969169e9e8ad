"""App config of the example's orders app."""

from __future__ import annotations

from django.apps import AppConfig


class OrdersConfig(AppConfig):
    """Orders placed through the example site."""

    name = "example_project.django_site.orders"
    label = "orders"
