"""pikku has no Django models: its tables are its own (``manage.py migrate`` makes them).

This module exists so Django sends this app ``post_migrate``; see
:mod:`pikku_celery.contrib.django.schema`.
"""
