"""A Pikku built on first access (PEP 562), as ``pikku_celery.contrib.django`` does."""

from __future__ import annotations

import os
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "pikku":
        if os.environ.get("PIKKU_CLI_LAZY_FAIL"):
            raise RuntimeError("settings lack PIKKU_CELERY")
        from tests.cli.cliapp import pikku

        return pikku
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
