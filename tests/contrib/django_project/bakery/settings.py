"""Settings as a user writes them: pikku's database is Django's ``default``."""

from __future__ import annotations

import os

SECRET_KEY = "bakery-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = ["pikku_celery.contrib.django", "bakery"]
ROOT_URLCONF = "bakery.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {
    "default": {
        "ENGINE": os.environ.get("BAKERY_DB_ENGINE", "django.db.backends.postgresql"),
        "NAME": os.environ["BAKERY_DB_NAME"],
        "USER": os.environ.get("BAKERY_DB_USER", "postgres"),
        "HOST": os.environ.get("BAKERY_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("BAKERY_DB_PORT", "5432"),
    }
}
PIKKU_CELERY = {"CELERY_APP": "bakery.celery.app", "OPTIONS": {"install_beat": False}}
