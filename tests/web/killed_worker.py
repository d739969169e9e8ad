"""A worker process that claims a step and hangs in its body, to be SIGKILLed.

    python -m tests.web.killed_worker DATABASE_URL STEP_ID MARK

It builds the tests' Pikku on the same database, claims the step through the
engine as a worker does (the lease renewed at half its length while the body
runs), and inside the body writes its pid to MARK and waits: the test kills
it there, mid-step, and the lease it stops renewing lapses on the store's
clock.
"""

from __future__ import annotations

import os
import sys

from tests.web import webapp


def main() -> None:
    """Claim the step and hang in its body until killed."""
    url, step_id, mark = sys.argv[1:4]
    os.environ["PIKKU_WEB_HANG_MARK"] = mark
    pikku = webapp.build(url, name="killed-worker")
    step = pikku.store.get_step(step_id)
    assert step is not None, f"no step {step_id}"
    webapp.run_step(pikku, step)


if __name__ == "__main__":
    main()
