"""pikku's Alembic migrations: ``pikku-celery db upgrade | check | current``.

Each server test gets an empty scratch database. The migrations and
``schema.metadata`` must describe the same schema (autogenerate finds no
difference), and the runtime refuses to start on a missing schema with an
error that names the command to run, never the password.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from click.testing import CliRunner

from pikku_celery.cli import main
from pikku_celery.errors import SchemaMissingError
from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.schema import metadata
from pikku_celery.store import migrate
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from tests.services import MYSQL_ADMIN_URL, PG_ADMIN_URL, SESSION_TAG, scratch_database

PASSWORD = "s3cret-pw"  # PostgreSQL here trusts loopback, so any password connects


@pytest.fixture(params=["postgres", "mariadb"])
def empty_url(request: pytest.FixtureRequest) -> Iterator[str]:
    admin = PG_ADMIN_URL if request.param == "postgres" else MYSQL_ADMIN_URL
    with scratch_database(admin, f"{SESSION_TAG}_m{uuid.uuid4().hex[:6]}") as url:
        if request.param == "postgres":
            url = sa.make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)
        yield url


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_db_upgrade_creates_the_schema_and_check_says_up_to_date(empty_url: str) -> None:
    code, out = cli("db", "current", "--database-url", empty_url)
    assert code == 0 and "none" in out
    code, out = cli("db", "check", "--database-url", empty_url)
    assert code == 1 and "pikku-celery db upgrade" in out

    code, out = cli("db", "upgrade", "--database-url", empty_url)
    assert code == 0, out
    assert f"upgraded to revision {migrate.head()}" in out
    code, out = cli("db", "check", "--database-url", empty_url)
    assert code == 0 and "up to date" in out, out
    code, out = cli("db", "current", "--database-url", empty_url)
    assert code == 0 and migrate.head() in out
    code, out = cli("db", "upgrade", "--database-url", empty_url)  # idempotent
    assert code == 0 and f"already at revision {migrate.head()}, nothing to upgrade" in out
    for text in (
        out,
        *[cli("db", c, "--database-url", empty_url)[1] for c in ("check", "current")],
    ):
        assert PASSWORD not in text

    engine = sa.create_engine(empty_url)
    try:
        names = set(sa.inspect(engine).get_table_names())
        assert set(metadata.tables) <= names and migrate.VERSION_TABLE in names
        assert "alembic_version" not in names  # never the application's own table
        store_for(engine)  # the runtime accepts it
    finally:
        engine.dispose()


def test_migrations_and_metadata_describe_the_same_schema(empty_url: str) -> None:
    migrate.upgrade(empty_url)
    engine = sa.create_engine(empty_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": False,
                    "include_object": migrate.include_object,
                },
            )
            diff = compare_metadata(ctx, metadata)
        assert diff == []
    finally:
        engine.dispose()


def test_env_var_and_the_applications_own_alembic_table(
    empty_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = sa.create_engine(empty_url)
    try:
        with engine.begin() as conn:  # the application's own Alembic history
            conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32))")
            conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('app0042')")
        monkeypatch.setenv("PIKKU_DATABASE_URL", empty_url)
        code, out = cli("db", "upgrade")
        assert code == 0, out
        assert cli("db", "check")[0] == 0
        with engine.connect() as conn:
            app = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all()
        assert app == ["app0042"]
    finally:
        engine.dispose()


def test_missing_tables_raise_schema_missing_error_naming_the_command(empty_url: str) -> None:
    engine = make_engine(empty_url)
    try:
        store = store_for(engine)  # building it touches no database
        with pytest.raises(SchemaMissingError) as info:
            store.list_runs()  # its first use checks, before anything is written
        message = str(info.value)
        assert "pikku-celery db upgrade --database-url" in message
        assert "pikku_workflow_step" in message
        assert PASSWORD not in message
        assert sa.inspect(engine).get_table_names() == []  # nothing created silently

        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE pikku_workflow_step DROP COLUMN worker"))
        with pytest.raises(SchemaMissingError, match=r"pikku_workflow_step lacks column.*worker"):
            store_for(engine).get_run("00000000-0000-4000-8000-000000000000")
        told = store_for(engine, upgrade_command="python manage.py pikku_celery db upgrade")
        with pytest.raises(SchemaMissingError, match=r"with: python manage\.py pikku_celery db"):
            told.prepare()
        code, out = cli("db", "check", "--database-url", empty_url)
        assert code == 1 and "worker" in out
    finally:
        engine.dispose()


def test_a_store_built_directly_on_a_server_creates_no_tables(empty_url: str) -> None:
    # SQLWorkflowStore(engine) is the portable store on any database; only an
    # embedded one (SQLite) gets its tables on first use.
    engine = make_engine(empty_url)
    try:
        with pytest.raises(SchemaMissingError, match="pikku-celery db upgrade"):
            SQLWorkflowStore(engine).list_runs()
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


def test_sqlite_creates_its_tables_unless_told_not_to(tmp_path: pytest.TempPathFactory) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    engine = make_engine(url)
    try:
        with pytest.raises(SchemaMissingError, match="pikku-celery db upgrade"):
            store_for(engine, create_tables=False).prepare()
        assert sa.inspect(engine).get_table_names() == []
        store_for(engine).list_runs()  # the embedded default creates them on first use
        assert set(metadata.tables) <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    other = f"sqlite:///{tmp_path}/migrated.db"
    assert cli("db", "upgrade", "--database-url", other)[0] == 0
    assert cli("db", "check", "--database-url", other)[0] == 0


def test_cli_reports_an_unreachable_database_without_the_password() -> None:
    url = f"postgresql+psycopg://postgres:{PASSWORD}@127.0.0.1:5432/{SESSION_TAG}_nope"
    result = CliRunner().invoke(main, ["db", "check", "--database-url", url])
    assert result.exit_code != 0
    assert PASSWORD not in result.output and "***" in result.output


def test_db_upgrade_at_head_with_a_column_dropped_says_so_and_fails(empty_url: str) -> None:
    code, out = cli("db", "upgrade", "--database-url", empty_url)
    assert code == 0, out
    engine = sa.create_engine(empty_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE pikku_workflow_step DROP COLUMN scheduled_at")
    finally:
        engine.dispose()
    result = CliRunner().invoke(main, ["db", "upgrade", "--database-url", empty_url])
    assert result.exit_code == 1, result.output
    assert f"already at revision {migrate.head()}" in result.output
    assert "differ" in result.output and "scheduled_at" in result.output
    assert PASSWORD not in result.output


def test_upgrade_from_0001_keeps_rows_and_makes_names_exact(empty_url: str) -> None:
    """A database made by 0001 (MariaDB's padding collation) is upgraded in
    place: its rows stay, its foreign keys stay, and from then on 'key' and
    'key ' are two idempotency keys, as on PostgreSQL."""
    migrate.upgrade(empty_url, "0001")
    engine = sa.create_engine(empty_url)
    run_id = "00000000-0000-4000-8000-000000000001"
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO pikku_workflow_run (id, workflow, status, idempotency_key, "
                    "cancel_requested, version, sweep_count, created_at, updated_at) "
                    "VALUES (:id, 'wf', 'running', 'padkey', false, 1, 0, 1, 1)"
                ),
                {"id": run_id},
            )
        migrate.upgrade(empty_url)
        assert migrate.check(empty_url).ok
        with engine.begin() as conn:
            found = conn.execute(
                sa.text("SELECT id, depth FROM pikku_workflow_run WHERE idempotency_key = :k"),
                {"k": "padkey "},
            ).all()
            assert found == []  # no longer the same key as 'padkey'
            [(kept, depth)] = conn.execute(
                sa.text("SELECT id, depth FROM pikku_workflow_run WHERE idempotency_key = 'padkey'")
            ).all()
            assert (kept, depth) == (run_id, 0)
        if engine.dialect.name in ("mysql", "mariadb"):
            inspector = sa.inspect(engine)
            for table in ("pikku_workflow_step", "pikku_workflow_signal"):
                [fk] = inspector.get_foreign_keys(table)
                assert fk["referred_table"] == "pikku_workflow_run"
            with engine.connect() as conn:
                collations = set(
                    conn.execute(
                        sa.text(
                            "SELECT DISTINCT collation_name FROM information_schema.columns "
                            "WHERE table_schema = DATABASE() AND table_name LIKE 'pikku_%' "
                            "AND data_type = 'varchar' AND column_name NOT IN ('status', 'kind') "
                            "AND table_name <> :version"
                        ),
                        {"version": migrate.VERSION_TABLE},
                    ).scalars()
                )
            assert collations == {"utf8mb4_nopad_bin"}
    finally:
        engine.dispose()
