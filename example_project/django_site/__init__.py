"""A minimal Django site on the shop's workflows: place an order, watch it run.

    python -m example_project.django_site.manage migrate
    python -m example_project.django_site.manage pikku_celery db upgrade
    celery -A example_project.app worker -B -Q celery,shipping   # another terminal
    python -m example_project.django_site.manage runserver

Run every command from the repository's root: the site and the worker find
the shop's SQLite files under ``.pikku-demo/`` (or ``PIKKU_DEMO_HOME``).
"""
