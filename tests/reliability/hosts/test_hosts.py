"""The cross-host fault suite, short form (CI); the long form by hand.

Each case runs workflows on two workers in network namespaces of their own,
the store and the broker on hosts of theirs, while one fault strikes (see
:mod:`.suite`); every invariant of the chaos suite must hold, and each case
adds its row to the table printed at the end. ``PIKKU_FAULT_SUITE_LONG=1``
runs the long form (200 runs over five minutes, a cut every 15 s), as does
``python -m tests.reliability.hosts.suite``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.services import unavailable

from ..chaosapp import STEPS
from .network import NamespacesRefused, leftovers
from .suite import CASES, LONG_ENV, HostsSummary, Lab, lab, long_config, render_table, short_config
from .suite import run_case as _run_case

LONG = os.environ.get(LONG_ENV) == "1"


@pytest.fixture(scope="module")
def table(request: pytest.FixtureRequest) -> Iterator[list[HostsSummary]]:
    rows: list[HostsSummary] = []
    yield rows
    if rows:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        text = "cross-host fault suite\n" + render_table(rows)
        if reporter is not None:
            reporter.write_line("\n" + text)
        else:
            print(text)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Lab]:
    """The hosts and their servers, for every case of the module."""
    try:
        with lab() as made:
            yield made
    except NamespacesRefused as exc:
        unavailable("network namespaces", exc)
    assert leftovers() == [], "the fault hosts were not all removed"


def run_case(hosts: Lab, table: list[HostsSummary], case: str) -> HostsSummary:
    cfg = long_config(case) if LONG else short_config(case)
    row = _run_case(hosts, cfg, echo=lambda line: print(line, flush=True))
    table.append(row)
    # run_case raised on any violation; these restate the headline invariants.
    assert row.completed == row.runs >= cfg.runs  # more: probes of a healed worker
    assert row.ledger_rows == row.steps == row.runs * STEPS
    assert row.faults >= 1, f"no fault was injected: {CASES[case]}"
    return row


@pytest.mark.slow
@pytest.mark.timeout(900 if LONG else 150)
def test_a_worker_cut_off_from_the_store_past_its_lease(
    hosts: Lab, table: list[HostsSummary]
) -> None:
    row = run_case(hosts, table, "db-cut")
    assert row.held >= 1, "the worker was cut off holding no step"
    assert row.refused >= 1, "its outcome, written after the heal, was not refused"
    assert row.max_recover is not None


@pytest.mark.slow
@pytest.mark.timeout(900 if LONG else 150)
def test_a_worker_cut_off_from_the_broker_past_the_visibility_timeout(
    hosts: Lab, table: list[HostsSummary]
) -> None:
    row = run_case(hosts, table, "broker-cut")
    assert row.max_recover is not None


@pytest.mark.slow
@pytest.mark.timeout(900 if LONG else 150)
def test_a_200_ms_round_trip_to_the_store(hosts: Lab, table: list[HostsSummary]) -> None:
    run_case(hosts, table, "db-latency")


@pytest.mark.slow
@pytest.mark.timeout(900 if LONG else 150)
def test_five_percent_of_store_connections_reset_mid_stream(
    hosts: Lab, table: list[HostsSummary]
) -> None:
    row = run_case(hosts, table, "db-drops")
    assert row.max_recover is not None


@pytest.mark.slow
@pytest.mark.timeout(900 if LONG else 150)
def test_a_partition_healing_after_the_lease_lapsed(hosts: Lab, table: list[HostsSummary]) -> None:
    row = run_case(hosts, table, "partition")
    assert row.held >= 1, "the worker was partitioned holding no step"
    assert row.refused >= 1, "its late outcome was not refused"
    assert row.max_recover is not None
