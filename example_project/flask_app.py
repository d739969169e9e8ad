"""A Flask app on the shop's workflows: an HTML page and the JSON API blueprint.

    celery -A example_project.app worker -B -Q celery,shipping   # one terminal
    flask --app example_project.flask_app run                    # another
    # or: python -m example_project.flask_app

Run both from the repository's root (they share ``.pikku-demo/``). Then open
http://127.0.0.1:5000/, or use the API::

    curl -X POST -H 'Content-Type: application/json' \\
         -d '{"input": {"id": 41, "cents": 2500, "country": "FI",
                        "lines": [{"sku": "mug", "qty": 1}]},
              "idempotency_key": "order-41"}' \\
         http://127.0.0.1:5000/api/workflows/shop.fulfil_order/runs
    curl http://127.0.0.1:5000/api/runs/RUN_ID
    curl -X POST -H 'Content-Type: application/json' -d '{"approved": true, "by": "me"}' \\
         http://127.0.0.1:5000/api/runs/RUN_ID/signals/approval
    curl -X POST -H 'X-Demo-Role: staff' http://127.0.0.1:5000/api/runs/RUN_ID/cancel
"""

from __future__ import annotations

import contextlib
import uuid

from flask import Flask, abort, redirect, render_template_string, request, url_for
from werkzeug.wrappers import Response

from example_project.app import pikku
from example_project.shop.workflows import LARGE_ORDER_CENTS, fulfil_order
from pikku_celery import RunNotFoundError, RunSettledError
from pikku_celery.contrib.flask import PikkuFlask, current_pikku, make_blueprint
from pikku_celery.contrib.summary import run_summary


def demo_permission(action: str, target: str) -> bool:
    """Anyone may start, watch and approve; cancelling needs ``X-Demo-Role: staff``.

    A real app would ask its login here (``flask_login.current_user``...).
    """
    if action == "cancel":
        return request.headers.get("X-Demo-Role") == "staff"
    return True


app = Flask(__name__)
PikkuFlask(pikku, app)
app.register_blueprint(make_blueprint(permission=demo_permission), url_prefix="/api")

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ title }}</title>
{% if run and not run.terminal %}<meta http-equiv="refresh" content="1">{% endif %}
<style>body { font-family: sans-serif; max-width: 60rem; margin: 2rem auto; }
td, th { padding: .2rem .6rem; text-align: left; vertical-align: top; }</style></head>
<body>
{% if run %}
  <p><a href="{{ url_for('index') }}">&larr; new order</a>
     · <a href="{{ url_for('pikku_celery.run_status', run_id=run.id) }}">as JSON</a></p>
  <h1>Order {{ run.input.id }}: <span id="status">{{ run.status }}</span></h1>
  {% if awaiting_approval %}
  <form method="post" action="{{ url_for('approve', run_id=run.id) }}">
    A large order waits for approval:
    <button name="decision" value="approve">Approve</button>
    <button name="decision" value="reject">Reject</button>
  </form>
  {% endif %}
  {% if run.output %}<p>Output: <code>{{ run.output | tojson }}</code></p>{% endif %}
  {% if run.error %}<p>Error: {{ run.error.type }}: {{ run.error.message }}</p>{% endif %}
  <table><tr><th>step</th><th>kind</th><th>status</th><th>attempts</th></tr>
  {% for step in run.steps %}
    <tr><td>{{ step.name }}</td><td>{{ step.kind }}</td><td>{{ step.status }}</td>
        <td>{% for a in step.attempts %}#{{ a.attempt }} {{ a.status }}
            {% if a.error %}({{ a.error.message }}){% endif %}<br>{% else %}-{% endfor %}</td></tr>
  {% endfor %}
  </table>
{% else %}
  <h1>Place an order</h1>
  <form method="post" action="{{ url_for('place_order') }}">
    <input type="hidden" name="key" value="{{ key }}">
    <p><label>cents <input name="cents" type="number" min="100" value="4999"></label>
       ({{ large }} or more waits for approval)</p>
    <p><label>country <select name="country"><option>FI</option><option>SE</option>
       <option value="AQ">AQ (no courier: refunded)</option></select></label></p>
    <button type="submit">Order</button>
  </form>
{% endif %}
</body></html>"""


@app.get("/")
def index() -> str:
    """The order form; its hidden key makes a double submit start one run, not two."""
    key = uuid.uuid4().hex
    return render_template_string(
        PAGE, title="Place an order", run=None, key=key, large=LARGE_ORDER_CENTS
    )


@app.post("/orders")
def place_order() -> Response:
    """Start ``shop.fulfil_order`` for the submitted form, then show its page."""
    try:
        cents = int(request.form["cents"])
        country = request.form["country"]
        key = uuid.UUID(request.form["key"]).hex
    except (KeyError, ValueError):
        abort(400, "cents (a number), country and key are required")
    order_id = int(key[:6], 16)  # the shop's tasks script their behaviour by order id
    order = {
        "id": order_id,
        "cents": cents,
        "country": country,
        "lines": [{"sku": "mug", "qty": 1}, {"sku": "tea", "qty": 2}],
        "cooling_off": 1.0,
        "approval_timeout": 300,
    }
    handle = fulfil_order.start(order, idempotency_key=f"flask-order-{key}")
    return redirect(url_for("order_page", run_id=handle.run_id))


@app.get("/orders/<run_id>")
def order_page(run_id: str) -> str:
    """The run's page; it refreshes itself until the run settles."""
    try:
        run = run_summary(current_pikku().handle(run_id))
    except (RunNotFoundError, ValueError):
        abort(404)
    awaiting = not run["terminal"] and any(
        s["kind"] == "signal" and s["status"] not in ("succeeded", "failed") for s in run["steps"]
    )
    return render_template_string(PAGE, title="Order", run=run, awaiting_approval=awaiting)


@app.post("/orders/<run_id>/approval")
def approve(run_id: str) -> Response:
    """The page's approval buttons: the ``approval`` signal the large order waits for."""
    approved = request.form.get("decision") == "approve"
    # Decided already, timed out or no such run: the page shows which.
    with contextlib.suppress(RunSettledError, RunNotFoundError, ValueError):
        current_pikku().send_signal(run_id, "approval", {"approved": approved, "by": "flask"})
    return redirect(url_for("order_page", run_id=run_id))


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=5000)
