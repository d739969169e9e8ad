"""The run page: one read API over the store, a live page on it, and its servers.

- :mod:`.reads` and :mod:`.shapes`: a page of runs and one run whole, as JSON
  (``pikku-celery runs list/show --json`` print the same);
- :mod:`.api`: the framework-neutral HTTP API (:class:`~.api.RunApi`): those
  reads and the actions cancel, retry and signal, behind a permission hook;
- :mod:`.page`: the page itself (plain HTML, JavaScript and CSS in
  ``static/``, shipped in the wheel: no CDN, no build step);
- :mod:`.workflow_api`: the blueprint's own endpoints (start, status, signal,
  cancel), framework-neutral as :mod:`.api` is;
- :mod:`.flask_blueprint` (with :mod:`.flask_ext`, :mod:`.flask_errors` and
  :mod:`.flask_routes`), :mod:`.app` and :mod:`.serve`: the Flask blueprint
  (:mod:`pikku_celery.contrib.flask` names it for users), the standalone app
  and its waitress server (``pikku-celery -A proj web``). Django mounts the same
  API with :mod:`pikku_celery.contrib.django.urls`.

Importing this package imports no web framework.
"""
