"""A claim a database crash lost: its step is sent again at once.

On PostgreSQL a claim from a message commits asynchronously; a crash right
after it can lose it, and the step is back to ``scheduled``. The worker
that ran the body finds its outcome refused and the step waiting for a
message, but that message was its own, about to be acked: it sends the
step again rather than leave it to the sweep (``message_grace`` later).
The crash is played here by putting the row back as it stood before the
claim while the body runs; no sweep runs.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from pikku_celery.engine import Context
from pikku_celery.sql.schema import metadata
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import make_engine


def test_a_step_whose_claim_was_lost_is_sent_again(sqlite_engine: sa.Engine) -> None:
    metadata.create_all(sqlite_engine)
    engine, dispatcher = make_engine(store_for(sqlite_engine), message_grace=3600)
    bodies: list[int] = []

    @dispatcher.task
    def charge(cents: int) -> str:
        bodies.append(cents)
        if len(bodies) == 1:  # the database crashes and loses this claim
            with sqlite_engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE pikku_workflow_step SET status = 'scheduled', attempt = 0, "
                        "claim_id = NULL, lease_expires_at = NULL, worker = NULL"
                    )
                )
                conn.execute(sa.text("DELETE FROM pikku_workflow_step_attempt"))
        return f"charged {cents}"

    @engine.workflow
    def order(ctx: Context, cents: int) -> Any:
        return ctx.step("charge", charge, cents)

    run = order.start(1999)
    dispatcher.run_until_idle()
    assert bodies == [1999, 1999]  # the body ran again: steps are at-least-once
    assert run.result() == "charged 1999"
