"""A project's workflows module as it is: its own Celery app and Pikku, its
workflows decorated at module level; no ``install`` function.

Its app is the project's, configured for production (a broker and database
that do not exist here): the plugin registers these workflows on the
setup's Pikku, and their steps' tasks reach the setup's app as Celery
shares every ``@app.task``.
"""

from __future__ import annotations

from celery import Celery

from pikku_celery import Context, Pikku

app = Celery("userland", broker="redis://127.0.0.1:1/0", set_as_current=False)
pikku = Pikku(app, "postgresql+psycopg://nobody@127.0.0.1:1/nowhere", install_beat=False)


@app.task(name="userland.shout")
def shout(text: str) -> str:
    return text.upper()


@pikku.workflow(name="userland.greet")
def greet(ctx: Context, who: str) -> str:
    return str(ctx.step("shout", shout, f"hello {who}"))


@pikku.workflow(name="userland.versioned", version=2)
def versioned(ctx: Context) -> int:
    return 2


@pikku.workflow(name="userland.versioned", version=1)
def versioned_before(ctx: Context) -> int:
    return 1
