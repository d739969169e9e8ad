"""Every statement of the SQL lease service, by name, built for one dialect.

=======================  ==================================================
name                     what it does
=======================  ==================================================
``lease.acquire``        the upsert, returning the row (where RETURNING is)
``lease.acquire_upsert`` the same upsert, without RETURNING (then read back)
``lease.read_back``      the row and the database's "now", locked
``lease.refresh``        the guarded ``UPDATE ... RETURNING`` of the expiry
``lease.refresh_update`` the same ``UPDATE`` without RETURNING (read back)
``lease.release``        the guarded ``UPDATE`` that frees the key
``lease.get``            the live row
=======================  ==================================================

Only the upsert is spelled differently per dialect (:class:`~..sql.dialect.Upsert`).
The ``RETURNING`` forms are built everywhere but run only where the server
has ``RETURNING`` (known once connected); elsewhere the service reads back.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..sql.dialect import Dialect, Upsert

ACQUIRE = "lease.acquire"
ACQUIRE_UPSERT = "lease.acquire_upsert"
READ_BACK = "lease.read_back"
REFRESH = "lease.refresh"
REFRESH_UPDATE = "lease.refresh_update"
RELEASE = "lease.release"
GET = "lease.get"


def _on_conflict(dialect: Dialect, t: sa.Table, values: dict[str, Any], ttl: Any) -> Any:
    """PostgreSQL's and SQLite's upsert: every assignment sees the old row."""
    ins = dialect.insert(t).values(values)
    new = ins.excluded
    # The clock is read once, in VALUES: "now" is the proposed expiry minus
    # the ttl. (clock_timestamp() moves between calls.)
    lapsed = t.c.expires_at <= new.expires_at - ttl
    return ins.on_conflict_do_update(
        index_elements=[t.c.key],
        set_={
            # Same live holder keeps its token; a change of hands (lapse or
            # release) bumps it.
            "token": sa.case((lapsed, t.c.token + values["token"]), else_=t.c.token),
            "holder": new.holder,
            "expires_at": new.expires_at,
        },
        where=sa.or_(lapsed, t.c.holder == new.holder),
    )


def _on_duplicate_key(dialect: Dialect, t: sa.Table, values: dict[str, Any], ttl: Any) -> Any:
    """MySQL's upsert, assigned left to right.

    Each assignment sees the columns already assigned, so token and holder
    are judged on the old expiry first, and expires_at last (by then holder
    is the new one exactly when this acquire won). UTC_TIMESTAMP() is fixed
    for the whole statement, so every "now" here is the same instant. The
    row is the answer whether or not it changed (MariaDB's RETURNING, or the
    read back): the holder says who won.
    """
    now, holder, one = dialect.now_ms, values["holder"], values["token"]
    lapsed = t.c.expires_at <= now
    return (
        dialect.insert(t)
        .values(values)
        .on_duplicate_key_update(
            [
                ("token", sa.case((lapsed, t.c.token + one), else_=t.c.token)),
                ("holder", sa.case((lapsed, holder), else_=t.c.holder)),
                (
                    "expires_at",
                    sa.case(
                        (sa.or_(lapsed, t.c.holder == holder), now + ttl),
                        else_=t.c.expires_at,
                    ),
                ),
            ]
        )
    )


_UPSERTS = {Upsert.ON_CONFLICT: _on_conflict, Upsert.ON_DUPLICATE_KEY: _on_duplicate_key}


def lease_statements(dialect: Dialect, t: sa.Table) -> dict[str, sa.Executable]:
    """The lease service's statements on table ``t``, by name."""
    now = dialect.now_ms
    key = sa.bindparam("lease_key", type_=t.c.key.type)
    holder = sa.bindparam("lease_holder", type_=t.c.holder.type)
    token = sa.bindparam("lease_token", type_=sa.BigInteger())
    ttl = sa.bindparam("ttl_ms", type_=sa.BigInteger())
    one = sa.literal_column("1", sa.BigInteger())
    zero = sa.literal_column("0", sa.BigInteger())
    values = {"key": key, "holder": holder, "token": one, "expires_at": now + ttl}
    upsert = _UPSERTS[dialect.upsert](dialect, t, values, ttl)
    mine = sa.and_(t.c.key == key, t.c.holder == holder, t.c.token == token)
    refresh = sa.update(t).where(mine, t.c.expires_at > now).values(expires_at=now + ttl)
    release = sa.update(t).where(mine, t.c.expires_at > zero).values(expires_at=zero)
    if dialect.skip_flush is not None:
        # A release need not wait for the WAL flush: if a crash loses it, the
        # lease merely stays held until its expiry, and the token is
        # untouched. Any later acquire is a durable commit that flushes this
        # one too, so tokens are never handed out twice. The setting is
        # local to this one-statement transaction and set only when the row
        # matched.
        release = release.where(dialect.skip_flush)
    if dialect.prepared:
        release = release.returning(t.c.token)  # how libpq's path counts what it matched
    return {
        ACQUIRE: upsert.returning(t.c.holder, t.c.token, t.c.expires_at),
        ACQUIRE_UPSERT: upsert,
        # FOR UPDATE where the dialect has it (SQLAlchemy renders none on SQLite).
        READ_BACK: sa.select(t.c.holder, t.c.token, t.c.expires_at, now.label("now"))
        .where(t.c.key == key)
        .with_for_update(),
        REFRESH: refresh.returning(t.c.expires_at),
        REFRESH_UPDATE: refresh,
        RELEASE: release,
        GET: sa.select(t.c.holder, t.c.token, t.c.expires_at).where(
            t.c.key == key, t.c.expires_at > now
        ),
    }
