"""The run page for a Django project: ``include()`` it under any prefix.

::

    # urls.py
    from django.urls import include, path

    urlpatterns = [path("ops/pikku/", include("pikku_celery.contrib.django.urls"))]

That serves the page at ``ops/pikku/`` (and Prometheus' ``ops/pikku/metrics``)
over ``get_pikku()``, behind
``settings.PIKKU_CELERY_PERMISSION`` (default: staff read, superusers
steer; see :mod:`.views`). With a hook, or a Pikku, of your own::

    from pikku_celery.contrib.django.urls import run_page_urls

    urlpatterns = [
        path("ops/pikku/", include((run_page_urls(permission=can_steer), "pikku_celery"))),
    ]
"""

from __future__ import annotations

from django.urls import URLPattern, path, re_path

from ...engine.core import WorkflowEngine
from ...web.permissions import Permission
from .views import RunPageViews

app_name = "pikku_celery"


def run_page_urls(
    permission: Permission | None = None,
    *,
    pikku: WorkflowEngine | None = None,
    max_body_bytes: int | None = None,
) -> list[URLPattern]:
    """The run page's URL patterns, for ``include((run_page_urls(...), "pikku_celery"))``."""
    views = RunPageViews(permission, pikku=pikku, max_body_bytes=max_body_bytes)
    return [
        path("", views.page, name="run_page"),
        path("assets/<str:name>", views.asset, name="run_page_asset"),
        path("api/runs", views.runs, name="api_runs"),
        path("api/runs/bulk/<str:action>", views.bulk, name="api_bulk"),
        path("api/runs/<str:run_id>", views.run, name="api_run"),
        path("api/runs/<str:run_id>/cancel", views.cancel, name="api_cancel"),
        path("api/runs/<str:run_id>/retry", views.retry, name="api_retry"),
        path("api/runs/<str:run_id>/signals/<str:name>", views.signal, name="api_signal"),
        path("metrics", views.metrics, name="metrics"),
        re_path(r"^(?:api|assets)(?:/|$)", views.not_found, name="run_page_not_found"),
    ]


urlpatterns = run_page_urls()
