"""The site's three pages: the order form and list, an order's status, its approval."""

from __future__ import annotations

from django.urls import path

from .orders import views

urlpatterns = [
    path("", views.index, name="index"),
    path("orders/<int:pk>/", views.order_detail, name="order"),
    path("orders/<int:pk>/approval", views.approve, name="approve"),
]
