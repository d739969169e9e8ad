"""``python -m pikku_celery.cli``: the same command without the console script."""

from __future__ import annotations

from . import main

main(prog_name="pikku-celery")
