"""Every backend against a reference model of the token rules (hypothesis).

Random sequences of acquire / refresh / release / get / expire by a few
holders on a couple of keys. Leases are long (a minute) so real time never
decides anything; a lapse is forced with the backend's own ``expire`` (as the
store would see it: the row's expiry in the past, the Redis hash gone, the
token kept).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from pikku_celery.lease import Lease
from tests.lease.conftest import BACKENDS, Backend, make_backend, new_key

KEYS = ["a", "b"]
HOLDERS = ["h1", "h2", "h3"]
TTL = 60.0

SETTINGS = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class KeyModel:
    """The reference: who holds the key, the last token granted, live or not."""

    holder: str | None = None
    token: int = 0
    live: bool = False

    def acquire(self, holder: str) -> int | None:
        if self.live and self.holder != holder:
            return None
        if not self.live:  # a new grant: change of hands, lapse or release
            self.token += 1
        self.holder, self.live = holder, True
        return self.token

    def owns(self, lease: Lease) -> bool:
        return self.live and self.holder == lease.holder and self.token == lease.token


@pytest.fixture(params=[*BACKENDS, "mariadb-readback", "sqlite-readback"])
def model_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """The five backends and the no-RETURNING path (a bound connection runs
    the very same statements, so it is left to the conformance suite)."""
    b = make_backend(request.param, request)
    yield b
    b.close()


def test_backend_matches_the_model(model_backend: Backend) -> None:
    backend = model_backend
    svc = backend.service

    class LeaseMachine(RuleBasedStateMachine):
        leases = Bundle("leases")

        def __init__(self) -> None:
            super().__init__()
            prefix = new_key("model")  # every example starts on fresh keys
            self.full = {k: f"{prefix}-{k}" for k in KEYS}
            self.short = {v: k for k, v in self.full.items()}
            self.model = {k: KeyModel() for k in KEYS}

        @rule(target=leases, key=st.sampled_from(KEYS), holder=st.sampled_from(HOLDERS))
        def acquire(self, key: str, holder: str) -> object:
            got = svc.acquire(self.full[key], holder, TTL)
            want = self.model[key].acquire(holder)
            if want is None:
                assert got is None
                return multiple()
            assert got is not None
            assert (got.key, got.holder, got.token) == (self.full[key], holder, want)
            return got

        @rule(lease=leases)
        def refresh(self, lease: Lease) -> None:
            got = svc.refresh(lease, TTL)
            if self.model[self.short[lease.key]].owns(lease):
                assert got is not None
                assert (got.holder, got.token) == (lease.holder, lease.token)
                assert got.expires_at >= lease.expires_at
            else:
                assert got is None

        @rule(lease=leases)
        def release(self, lease: Lease) -> None:
            svc.release(lease)
            m = self.model[self.short[lease.key]]
            if m.owns(lease):
                m.live = False

        @rule(key=st.sampled_from(KEYS))
        def expire(self, key: str) -> None:
            backend.expire(self.full[key])
            self.model[key].live = False

        @invariant()
        def get_agrees(self) -> None:
            for key, m in self.model.items():
                got = svc.get(self.full[key])
                if m.live:
                    assert got is not None
                    assert (got.holder, got.token) == (m.holder, m.token)
                else:
                    assert got is None

    run_state_machine_as_test(LeaseMachine, settings=SETTINGS)
