"""URLconf of the Django bulk test: the run page over a Pikku of its own (so
its runs never show in the other mount tests' listings)."""

from __future__ import annotations

from django.urls import include, path

from pikku_celery.contrib.django.urls import run_page_urls

from . import webapp

PIKKU = webapp.build(name="django-bulk")
ALLOWED: set[str] = {"list", "status"}


def permission(action: str, target: str) -> bool:
    """The test's hook: what ``ALLOWED`` holds."""
    return action in ALLOWED


urlpatterns = [
    path("bulk/", include((run_page_urls(permission=permission, pikku=PIKKU), "pikku_celery"))),
]
