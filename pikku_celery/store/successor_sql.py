"""The SQL side of ``ctx.continue_as_new``: the successor run and both links,
written in the transaction of the pass that ends its predecessor."""

from __future__ import annotations

import sqlalchemy as sa

from ..model.plan import PassWrite
from ..sql.schema import run_key_table as K
from ..sql.schema import run_table as R
from .rows import run_params

_insert = sa.insert(R)
_insert_key = sa.insert(K)
_link = (
    sa.update(R)
    .where(R.c.id == sa.bindparam("p_id"))
    .values(continued_as=sa.bindparam("p_successor"))
)


def write_successor(conn: sa.Connection, plan: PassWrite) -> None:
    """Insert ``plan``'s successor (linked back to its run) and link the run
    to it. Inside the pass's version-pinned write: a pass that lands twice
    does not exist, so neither does a second successor (and its id and
    idempotency key, both made from the predecessor's id, would refuse one).
    Its key's row too, as a start with that key writes it: a start with it
    finds the successor."""
    new, text = plan.successor, plan.successor_input
    assert new is not None and text is not None
    now = plan.now
    row = {**run_params(new, text, now), "created_at": now, "updated_at": now}
    if new.idempotency_key is not None:
        key = {"workflow": new.workflow, "idempotency_key": new.idempotency_key}
        conn.execute(_insert_key, {**key, "run_id": new.id, "created_at": now})
    conn.execute(_insert, row)
    conn.execute(_link, {"p_id": plan.run.id, "p_successor": new.id})
