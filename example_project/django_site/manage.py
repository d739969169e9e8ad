"""Django's manage.py for the example site: ``python -m example_project.django_site.manage``."""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Run a management command with the example's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.django_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
