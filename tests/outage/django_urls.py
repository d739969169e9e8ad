"""URLconf of the outage tests: the run page of :mod:`.down_app` in Django."""

from __future__ import annotations

from django.urls import include, path

from pikku_celery.contrib.django.urls import run_page_urls

from .down_app import pikku


def everyone(action: str, target: str) -> bool:
    """Every request may do everything: the store's outage is what is tested."""
    return True


urlpatterns = [
    path("down/", include((run_page_urls(permission=everyone, pikku=pikku), "pikku_celery"))),
]
