"""The fault hosts: what a crashed run left behind is removed, and nothing is left after."""

from __future__ import annotations

import subprocess

import pytest

from tests.services import unavailable

from .network import BRIDGE, PREFIX, NamespacesRefused, check_allowed, leftovers, topology


@pytest.fixture
def namespaces() -> None:
    try:
        check_allowed()
    except NamespacesRefused as exc:
        unavailable("network namespaces", exc)


def test_a_crashed_runs_hosts_are_removed_first_and_everything_after(namespaces: None) -> None:
    # what a run killed with SIGKILL leaves behind
    for argv in (["netns", "add", f"{PREFIX}w1"], ["link", "add", BRIDGE, "type", "bridge"]):
        subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=30)
    try:
        with topology(["w1", "w2"]) as hosts:
            assert sorted(leftovers()) == sorted(
                [BRIDGE, *(n for h in hosts.values() for n in (h.name, h.outer_link))]
            )
            assert [h.address for h in hosts.values()] == ["10.213.7.2", "10.213.7.3"]
    finally:
        remaining = leftovers()
    assert remaining == []
