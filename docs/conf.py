"""Sphinx configuration of pikku-celery's documentation site.

Pages are MyST Markdown (``docs/*.md``, the guides in ``docs/guide/``); the
API reference is generated from the docstrings. Built by ``scripts/test``
with warnings as errors: ``sphinx-build -W --keep-going -b html docs OUT``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's pikku_celery, as the tests import it

import pikku_celery  # noqa: E402

# The packages import their heavy names on first use (PEP 562); autodoc lists
# only what a module holds, so each documented package's ``__all__`` is loaded.
for package in ("pikku_celery", "pikku_celery.lease", "pikku_celery.store"):
    module = importlib.import_module(package)
    for name in module.__all__:
        getattr(module, name)

project = "pikku-celery"
author = "pikku-celery contributors"
release = version = pikku_celery.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links work as on GitHub

html_theme = "furo"
html_title = f"pikku-celery {release}"

autodoc_member_order = "bysource"
autodoc_typehints = "description"  # signatures stay short; types go with the parameters
autodoc_default_options = {"members": True, "show-inheritance": True}
# A public name is re-exported from several modules (pikku_celery.RunStatus is
# pikku_celery.store.RunStatus): a type in a signature may then resolve to
# either; that is one object, not an ambiguity worth failing the build over.
suppress_warnings = ["ref.python"]
