"""``manage.py pikku_celery``."""
