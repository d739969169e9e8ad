"""Settings of the example site: SQLite for Django, the shop's Pikku for workflows.

Not for production (a fixed secret key, DEBUG on).
"""

from __future__ import annotations

import os
from pathlib import Path

# The same folder example_project.app keeps the shop's store and broker in.
HOME = Path(os.environ.get("PIKKU_DEMO_HOME", Path.cwd() / ".pikku-demo")).resolve()
HOME.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "pikku_celery.contrib.django",  # manage.py pikku_celery, settings checks
    "example_project.django_site.orders",
]
MIDDLEWARE = ["django.middleware.csrf.CsrfViewMiddleware"]
ROOT_URLCONF = "example_project.django_site.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]

# Django's own data (the orders); the workflows live in the shop's database.
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": HOME / "django_site.db"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

# The shop already builds its Pikku (example_project/app.py), with the
# workflows registered on it: point at it. A project without one would give
# {"CELERY_APP": "proj.celery.app"} and let the database URL come from
# DATABASES["default"].
PIKKU_CELERY = {"PIKKU": "example_project.app:pikku"}
