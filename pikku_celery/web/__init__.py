"""The run page: one read API over the store, a live page on it, and its servers.

- :mod:`.reads` and :mod:`.shapes`: a page of runs and one run whole, as JSON
  (``pikku-celery runs list/show --json`` print the same);
- :mod:`.api`: the framework-neutral HTTP API (:class:`~.api.RunApi`): those
  reads and the actions cancel, retry and signal, behind a permission hook;
- :mod:`.page`: the page itself (plain HTML, JavaScript and CSS in
  ``static/``, shipped in the wheel: no CDN, no build step);
- :mod:`.flask_routes`, :mod:`.app` and :mod:`.serve`: the Flask routes (on
  :func:`pikku_celery.contrib.flask.make_blueprint`), the standalone app and
  its waitress server (``pikku-celery -A proj web``). Django mounts the same
  API with :mod:`pikku_celery.contrib.django.urls`.

Importing this package imports no web framework.
"""
