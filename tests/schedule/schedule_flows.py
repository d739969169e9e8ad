"""The schedule the long-form beats run, installed on :mod:`tests.celery.realapp`
through ``PIKKU_T_EXTRA``: ``every`` seconds from ``PIKKU_T_EVERY``, catch-up
from ``PIKKU_T_CATCH_UP``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku

WORKFLOW = "scheduled-long"


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    """The workflow and its schedule (which installs ``pikku-schedules`` into beat)."""

    @pikku.schedule(
        every=float(env.get("PIKKU_T_EVERY", "5")),
        catch_up=int(env.get("PIKKU_T_CATCH_UP", "2")),
        name="long",
        input={"from": "beat"},
    )
    @pikku.workflow(name=WORKFLOW)
    def scheduled(ctx: Context, data: dict[str, Any]) -> dict[str, Any]:
        return data
