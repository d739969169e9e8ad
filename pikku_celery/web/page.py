"""The run page's HTML shell and its assets, read from the package.

The page is one document (``static/index.html``): the runs list, or with
``?run=<id>`` one run's view, both drawn by ``static/app.js`` from the JSON
API. The shell only learns where the API and the assets are mounted (and a
CSRF token where the framework has one), so the same files serve the
standalone server, a Flask blueprint and a Django ``include()`` at any
prefix. Only the files in :data:`ASSETS` are ever served.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import cache
from importlib import resources

ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "timeline.js": "text/javascript; charset=utf-8",
    "format.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
"""Every asset the page loads, with its content type: nothing else is served."""

HTML_TYPE = "text/html; charset=utf-8"

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page loads only its own files and talks only to its own API: stored
values (a run's input, an error message) can never become running script."""

PAGE_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
"""Headers of the page and its assets."""


@dataclass(frozen=True)
class Asset:
    """One of the page's files: its bytes and content type."""

    body: bytes
    content_type: str


@cache
def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def asset(name: str) -> Asset | None:
    """The asset called ``name``, or None for any other name (a 404)."""
    content_type = ASSETS.get(name)
    if content_type is None:
        return None
    return Asset(_read(name), content_type)


def render_page(api_url: str, assets_url: str, csrf_token: str | None = None) -> str:
    """The page's HTML with its mount points filled in.

    ``api_url`` and ``assets_url`` end with ``/`` (``/pikku/api/``,
    ``/pikku/assets/``); the CSRF token, when given, goes into every action's
    ``X-CSRFToken`` header (Django's).
    """
    for url in (api_url, assets_url):
        if not url.endswith("/"):
            raise ValueError(f"mount URLs end with '/': {url!r}")
    text = _read("index.html").decode()
    return (
        text.replace("{{api}}", html.escape(api_url, quote=True))
        .replace("{{assets}}", html.escape(assets_url, quote=True))
        .replace("{{csrf}}", html.escape(csrf_token or "", quote=True))
    )
