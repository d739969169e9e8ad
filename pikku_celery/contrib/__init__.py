"""Integrations with web frameworks: ``pikku_celery.contrib.django`` and ``.flask``.

Each is imported only by projects that use that framework, so neither Django
nor Flask is a dependency of pikku-celery itself (``pip install
pikku-celery[django]`` / ``[flask]``).
"""
