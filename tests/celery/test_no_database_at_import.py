"""Building a Pikku touches no database: an app imports (a Django
``makemigrations``, ``celery inspect``, ``db upgrade`` itself) with its
database down or bare, and its first use says what is wrong and what to run."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from celery import Celery

from pikku_celery import Context, Pikku, SchemaMissingError, StoreUnavailableError
from pikku_celery.store import migrate
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database


@pytest.fixture
def bare_pg_url() -> Iterator[str]:
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_bare{uuid.uuid4().hex[:6]}") as url:
        yield url


def app() -> Celery:
    made = Celery("lazy", broker="memory://", set_as_current=False)
    made.conf.task_default_queue = f"lazy-{uuid.uuid4().hex[:8]}"
    return made


def test_a_pikku_on_a_database_that_is_down_builds_and_fails_on_first_use() -> None:
    pikku = Pikku(app(), database_url="postgresql+psycopg://pikku:pw@127.0.0.1:1/shop")

    @pikku.workflow(name="lazy.flow")
    def flow(ctx: Context) -> int:
        return 1

    assert pikku.registry.names() == ["lazy.flow", "pikku.canvas"]  # and the built-in canvas
    with pytest.raises(StoreUnavailableError, match=r"pikku:\*\*\*@127\.0\.0\.1:1/shop"):
        flow.start()


def test_a_bare_database_names_the_command_then_works_once_upgraded(bare_pg_url: str) -> None:
    command = "python manage.py pikku_celery db upgrade"
    pikku = Pikku(app(), database_url=bare_pg_url, upgrade_command=command, install_beat=False)

    @pikku.workflow(name="lazy.wait")
    def wait(ctx: Context) -> object:
        return ctx.wait_for_signal("go")

    with pytest.raises(SchemaMissingError, match=f"with: {re.escape(command)}"):
        wait.start()
    probe = sa.create_engine(bare_pg_url, poolclass=sa.pool.NullPool)
    assert sa.inspect(probe).get_table_names() == []  # nothing made, nothing written
    migrate.upgrade(bare_pg_url)
    run = wait.start()  # the same Pikku, no restart: the next use checks again
    assert run.status().value == "running"
    assert pikku.sql_engine is not None
    pikku.sql_engine.dispose()
    probe.dispose()
