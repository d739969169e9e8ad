"""A year of runs in bulk, straight into PostgreSQL: the data the scale checks read.

    python benchmarks/scale_data.py [--runs 10000,1000000] [--steps-per-run 10] [--reuse]

For each size it creates a scratch database ``pikku_scale_<runs>`` (on the
server of ``PIKKU_TEST_PG_URL``), brings it to pikku's head revision, and
fills it with ``generate_series`` INSERTs (no Python rows, no API): ``runs``
runs over a year, ``steps-per-run`` steps each with one attempt row each.
Ninety-nine runs in a hundred are settled (completed, some failed or
cancelled); the live hundredth waits on a held lease, a lapsed lease, a timer
or a lost message, in turn. No run is idle: the idle sweep's worst case, the
one where it must prove every live run busy. Indexes and constraints are
dropped for the load and made again after it (as a restore would), then the
tables are ANALYZEd.

Without ``--reuse`` the databases are dropped at the end
(``DROP DATABASE ... WITH (FORCE)``); with it an existing database of the
right size is kept as it is and reused. :mod:`benchmarks.scale` times the
named statements on these databases; ``tests/store/test_explain_at_size.py``
runs a short form of the same :func:`generate` (``tests/scale_data.py``, where
it lives: tests import nothing from benchmarks).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa

from pikku_celery.store import migrate
from tests.scale_data import LIVE_KINDS, Shape, generate  # the data the tests check too

__all__ = ["LIVE_KINDS", "Shape", "drop", "generate", "prepare", "sizes"]

PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def database_name(runs: int) -> str:
    """The scratch database of a size."""
    return f"pikku_scale_{runs}"


def _admin() -> sa.Engine:
    return sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)


def existing_shape(url: str) -> Shape | None:
    """What an earlier ``--reuse`` run left in the database at ``url`` (None: nothing)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT runs, steps_per_run, now_ms FROM pikku_scale_shape"
            ).first()
    except sa.exc.DBAPIError:
        return None
    finally:
        engine.dispose()
    return None if row is None else Shape(int(row[0]), int(row[1]), int(row[2]))


def prepare(runs: int, steps_per_run: int, reuse: bool, log: Callable[[str], None]) -> str:
    """The URL of a scratch database holding ``runs`` runs (made, or reused)."""
    name = database_name(runs)
    url = sa.make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    if reuse:
        found = existing_shape(url)
        if found is not None and found.runs == runs and found.steps_per_run == steps_per_run:
            migrate.upgrade(url)  # indexes added since it was made
            log(f"{name}: reused ({runs:,} runs)")
            return url
    admin = _admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    migrate.upgrade(url)
    log(f"{name}: generating {runs:,} runs, {runs * steps_per_run:,} steps")
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    shape = generate(engine, runs, steps_per_run, log)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE pikku_scale_shape (runs bigint, steps_per_run int, now_ms bigint)"
        )
        conn.execute(
            sa.text("INSERT INTO pikku_scale_shape VALUES (:r, :s, :n)"),
            {"r": runs, "s": steps_per_run, "n": shape.now_ms},
        )
    engine.dispose()
    return url


def drop(runs: int) -> None:
    """Drop the scratch database of a size."""
    admin = _admin()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {database_name(runs)} WITH (FORCE)")
    admin.dispose()


def sizes(text: str) -> list[int]:
    """``10000,1000000`` as a list of sizes."""
    return [int(float(s)) for s in text.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=sizes, default=[10_000, 1_000_000])
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--reuse", action="store_true", help="keep (and reuse) the databases")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    for runs in args.runs:
        started = time.perf_counter()
        prepare(runs, args.steps_per_run, args.reuse, log)
        log(f"{database_name(runs)}: ready in {time.perf_counter() - started:.0f} s")
        if not args.reuse:
            drop(runs)


if __name__ == "__main__":
    main()
