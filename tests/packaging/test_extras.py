"""A backend used without its extra says which extra to install (issue 27, item 2).

Each case runs in a process of its own in which the backend's libraries cannot
be imported (an import hook refuses them, as a venv without the extra would),
so the test venv's full install does not hide the failure. The real thing, a
venv with the core alone, is ``scripts/check-wheel``'s.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCK = """
import sys

class Missing:
    # What a venv without the extra looks like: the modules are not there.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
"""


def run_without(modules: set[str], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``modules`` cannot be imported."""
    source = BLOCK.format(blocked=modules) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_core_imports_builds_a_pikku_on_sqlite_and_lists_its_cli(tmp_path: Path) -> None:
    done = run_without(
        {"psycopg", "pymysql", "redis", "packaging", "flask", "waitress", "prometheus_client"},
        """
        import sys
        from celery import Celery
        from pikku_celery import Pikku
        from pikku_celery.cli import main

        pikku = Pikku(Celery("core", broker="memory://"), database_url=sys.argv[1])
        print(pikku.store.list_runs(limit=1))
        main(["--help"], standalone_mode=False)
        """,
        f"sqlite:///{tmp_path / 'core.db'}",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[]")
    assert "runs" in done.stdout and "db" in done.stdout  # the CLI's commands


def database_error(url: str, missing: set[str]) -> str:
    """The error ``Pikku(app, database_url=url)`` raises when ``missing`` are absent."""
    done = run_without(
        missing,
        """
        import sys
        from celery import Celery
        from pikku_celery import Pikku
        from pikku_celery.errors import StoreError

        try:
            Pikku(Celery("x", broker="memory://"), database_url=sys.argv[1])
        except StoreError as exc:
            print(exc)
        """,
        url,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_postgresql_without_its_extra_names_the_postgres_extra() -> None:
    error = database_error("postgresql+psycopg://user:secret@127.0.0.1/shop", {"psycopg"})
    assert "pip install 'pikku-celery[postgres]'" in error
    assert "psycopg" in error
    assert "secret" not in error  # the URL is shown masked


def test_mysql_without_its_extra_names_the_mysql_extra() -> None:
    error = database_error("mysql+pymysql://root@127.0.0.1/shop", {"pymysql"})
    assert "pip install 'pikku-celery[mysql]'" in error


def test_the_redis_lease_service_without_its_extra_names_the_redis_extra() -> None:
    done = run_without(
        {"redis"},
        """
        from pikku_celery.extras import MissingExtraError

        try:
            from pikku_celery.lease import RedisLeaseService
        except ImportError as exc:  # an ImportError still, for optional-import guards
            print(type(exc).__name__, isinstance(exc, MissingExtraError), exc)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MissingExtraError True RedisLeaseService needs")
    assert "pip install 'pikku-celery[redis]'" in done.stdout


def test_a_worker_on_redis_without_the_extra_stops_naming_the_redis_extra(
    tmp_path: Path,
) -> None:
    """What issue 27 met: kombu's Redis transport needs ``packaging``; the worker
    now stops before connecting, with the command to run."""
    (tmp_path / "redisapp.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery
            from pikku_celery import Pikku

            app = Celery("redisapp", broker="redis://127.0.0.1:1/0")
            pikku = Pikku(app, database_url="sqlite:///{tmp_path / "w.db"}")
            """
        )
    )
    done = run_without(
        {"packaging"},
        """
        import sys
        from celery.__main__ import main

        sys.path.insert(0, sys.argv[1])
        sys.argv = ["celery", "-A", "redisapp", "worker", "-P", "solo"]
        main()
        """,
        str(tmp_path),
    )
    assert done.returncode != 0
    assert (
        "pikku-celery: the 'redis' broker needs pikku-celery's 'redis' extra "
        "(packaging is not installed): pip install 'pikku-celery[redis]'"
    ) in done.stderr
