"""A beat's part in a process of its own: ``pikku.run_schedules()`` every
``--interval`` seconds, what the ``pikku-schedules`` beat entry has a worker
do. Each pass that started, skipped or dropped a tick prints one JSON line.

``python -m tests.schedule.driver URL NAME EVERY CATCH_UP INTERVAL [NOT_BEFORE]``
runs until killed; with ``NOT_BEFORE`` (epoch ms) its first pass waits for
that time on the database's clock (a beat started while another is still
down, its imports done). Two of them on one schedule are two beats.
"""

from __future__ import annotations

import json
import os
import sys
import time

from celery import Celery

from pikku_celery import Context, Pikku


def main(
    url: str, name: str, every: float, catch_up: int, interval: float, not_before: int
) -> None:
    app = Celery(f"driver-{name}", broker="memory://", set_as_current=False)
    pikku = Pikku(app, url, install_beat=False, schedule_interval=interval)

    @pikku.schedule(every=every, catch_up=catch_up, name=name, input={"schedule": name})
    @pikku.workflow(name=f"scheduled-{name}")
    def scheduled(ctx: Context, data: dict[str, str]) -> dict[str, str]:
        return data

    print(json.dumps({"pid": os.getpid(), "ready": True}), flush=True)
    while pikku.schedule_store.now_ms() < not_before:
        time.sleep(0.02)  # the beat is down until then: the scenario, not synchronisation
    while True:
        report = pikku.run_schedules()
        if report.started or report.skipped or report.dropped or report.failed:
            print(json.dumps({"pid": os.getpid(), **report.__dict__}), flush=True)
        time.sleep(interval)  # the beat's own period, not synchronisation


if __name__ == "__main__":
    url, name, every, catch_up, interval = sys.argv[1:6]
    not_before = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    main(url, name, float(every), int(catch_up), float(interval), not_before)
