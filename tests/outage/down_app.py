"""An app whose workflow database is down: nothing listens on its port.

Calls give up on the outage quickly (``outage_timeout``), so the catalogue
of public calls runs in seconds. The CLI loads it with ``-A``, Django's
URLconf of these tests mounts its run page.
"""

from __future__ import annotations

from celery import Celery

from pikku_celery import Context, Pikku

DOWN_URL = "postgresql+psycopg://postgres@127.0.0.1:9/pikku_down"
OUTAGE_TIMEOUT = 0.3
RUN_ID = "6f1c1e0e-1111-4222-8333-444455556666"

app = Celery("down", broker="memory://", set_as_current=False)
pikku = Pikku(app, DOWN_URL, install_beat=False, outage_timeout=OUTAGE_TIMEOUT)


@app.task(name="down.echo", shared=False)
def echo(value: str) -> str:
    return value


@pikku.workflow(name="down.flow")
def flow(ctx: Context, value: str) -> str:
    return str(ctx.step("echo", echo, value))
