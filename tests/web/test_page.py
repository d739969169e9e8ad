"""The page's files: all shipped, all served, nothing remote, nothing as markup."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pikku_celery.web import page
from pikku_celery.web.page import ASSETS, asset, render_page

STATIC = Path(page.__file__).parent / "static"
ROOT = Path(__file__).resolve().parents[2]


def test_every_file_in_static_is_the_shell_or_a_served_asset_and_ships_in_the_wheel() -> None:
    assert {p.name for p in STATIC.iterdir()} == {"index.html", *ASSETS}
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "web/static/*" in config["tool"]["setuptools"]["package-data"]["pikku_celery"]
    for name in ASSETS:
        found = asset(name)
        assert found is not None and found.body == (STATIC / name).read_bytes()
    assert asset("index.html") is None and asset("../api.py") is None


@pytest.mark.parametrize("name", [*ASSETS, "index.html"])
def test_the_page_loads_nothing_remote_and_writes_no_markup(name: str) -> None:
    text = (STATIC / name).read_text()
    assert "https://" not in text and "//cdn" not in text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in text, f"{name} uses {sink}: values from the store must stay text"


def test_the_shell_escapes_its_mount_points() -> None:
    html = render_page('/a"><script>x</script>/', "/assets/", csrf_token='t"k')
    assert "<script>x</script>" not in html
    assert 'data-api="/a&quot;&gt;&lt;script&gt;x&lt;/script&gt;/"' in html
    assert 'data-csrf="t&quot;k"' in html
    with pytest.raises(ValueError, match="end with '/'"):
        render_page("/api", "/assets/")
