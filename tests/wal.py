"""What a database wrote, counted by PostgreSQL in its write-ahead log.

``pg_walinspect`` reads the log's records between two positions: the
transactions that committed and touched a database's relations are the
write transactions it ran, whoever sent them, with nothing to instrument.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

FLUSH_WAIT_SECONDS = 30.0


def wal_position(conn: sa.Connection) -> str:
    """Where the log ends now, once flushed that far (asynchronous commits
    are flushed by the WAL writer within moments; only flushed records can
    be read)."""
    lsn = str(conn.execute(sa.text("SELECT pg_current_wal_insert_lsn()")).scalar_one())
    flushed = sa.text("SELECT pg_current_wal_flush_lsn() >= CAST(:lsn AS pg_lsn)")
    deadline = time.monotonic() + FLUSH_WAIT_SECONDS
    while not conn.execute(flushed, {"lsn": lsn}).scalar_one():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the WAL was not flushed to {lsn} within {FLUSH_WAIT_SECONDS} s")
        time.sleep(0.02)  # the WAL writer's own pace
    return lsn


def database_oid(conn: sa.Connection, name: str) -> int:
    """The oid of database ``name`` (the log names relations by it)."""
    query = sa.text("SELECT oid FROM pg_database WHERE datname = :n")
    return int(conn.execute(query, {"n": name}).scalar_one())


def write_transactions(conn: sa.Connection, db_oid: int, since: str, until: str) -> int:
    """Committed transactions between two log positions that wrote to the
    database ``db_oid`` (needs ``CREATE EXTENSION pg_walinspect``)."""
    return int(
        conn.execute(
            sa.text(
                """
                WITH records AS (
                    SELECT xid, resource_manager, record_type, block_ref
                    FROM pg_get_wal_records_info(CAST(:since AS pg_lsn), CAST(:until AS pg_lsn))
                )
                SELECT count(DISTINCT CAST(CAST(xid AS text) AS bigint)) FROM records
                WHERE resource_manager = 'Transaction' AND record_type LIKE 'COMMIT%'
                  AND xid IN (SELECT xid FROM records WHERE block_ref LIKE :rel)
                """
            ),
            {"since": since, "until": until, "rel": f"%rel %/{db_oid}/%"},
        ).scalar_one()
    )
