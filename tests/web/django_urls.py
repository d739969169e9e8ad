"""URLconf of the Django mount tests: the page included twice.

``ops/pikku/``: ``include("pikku_celery.contrib.django.urls")`` as written in
a project, over ``get_pikku()`` and ``settings.PIKKU_CELERY_PERMISSION``;
``mine/``: ``run_page_urls(...)`` with a Pikku and a hook of the test's own.
"""

from __future__ import annotations

from django.urls import include, path

from pikku_celery.contrib.django.urls import run_page_urls

from . import webapp

PIKKU = webapp.build(name="django-mount")
ALLOWED: set[str] = {"list", "status", "cancel", "retry", "signal"}


def permission(action: str, target: str) -> bool:
    """The test's hook: what ``ALLOWED`` holds."""
    return action in ALLOWED


urlpatterns = [
    path("ops/pikku/", include("pikku_celery.contrib.django.urls")),
    path(
        "mine/",
        include((run_page_urls(permission=permission, pikku=PIKKU), "pikku_celery"), "mine"),
    ),
]
