"""``python -m tests.reliability.launch ARGS``: run ``celery ARGS``.

With ``PIKKU_CHAOS_SLEEP_SHIM=1`` it first replaces :func:`time.sleep` with a
``select()`` timeout. That is for a worker under ``faketime`` with
``FAKETIME_DONT_FAKE_MONOTONIC=1``: Debian's libfaketime 0.9.10 mangles the
absolute CLOCK_MONOTONIC deadline of ``clock_nanosleep``, which Python 3.11's
``time.sleep`` uses, and the call fails with EINVAL (libfaketime issue #426).
Without that variable libfaketime fakes the monotonic clock too, and every
timed lock wait (``sem_clockwait``) hangs (#390). The shim must be in place
before Celery and kombu import ``sleep``, hence a launcher.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import SupportsIndex


def _select_sleep(secs: float | SupportsIndex, /) -> None:
    seconds = float(secs)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


def install_sleep_shim() -> None:
    """Make :func:`time.sleep` a ``select()`` timeout (see the module's doc)."""
    time.sleep = _select_sleep


def main(argv: list[str]) -> None:
    if os.environ.get("PIKKU_CHAOS_SLEEP_SHIM") == "1":
        install_sleep_shim()
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", *argv]
    celery_main()


if __name__ == "__main__":
    main(sys.argv[1:])
