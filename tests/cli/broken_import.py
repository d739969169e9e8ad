"""An app module whose own import fails: -A must say so, not "module not found"."""

from __future__ import annotations

import pikku_cli_test_missing_dependency  # type: ignore[import-not-found]  # noqa: F401
