"""The helpers that touch the shared servers keep to the session's own connections."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.services import SUITE_APP_NAME, terminate_backend


def test_terminate_backend_kills_only_the_session_s_own(
    postgres_url: str, postgres_engine: sa.Engine
) -> None:
    other = sa.create_engine(
        postgres_url,
        poolclass=sa.pool.NullPool,
        connect_args={"application_name": "another-developer"},
    )
    with other.connect() as theirs:
        pid = theirs.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with pytest.raises(AssertionError, match="not one of this session's"):
            terminate_backend(postgres_engine, pid)
        assert theirs.exec_driver_sql("SELECT 1").scalar_one() == 1  # still alive
    other.dispose()

    with postgres_engine.connect() as ours:
        name = ours.exec_driver_sql("SHOW application_name").scalar_one()
        pid = ours.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        ours.rollback()
        assert name == SUITE_APP_NAME
        terminate_backend(postgres_engine, pid)
        with pytest.raises(sa.exc.OperationalError):
            ours.exec_driver_sql("SELECT 1")
