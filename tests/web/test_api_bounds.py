"""What a caller sends that pikku cannot take is a 4xx naming why, never a 500:
bodies nested too deep to decode, payloads past the depth limit, a second
signal of a name with another payload."""

from __future__ import annotations

import pytest

from .test_api import Shop, api, error, json_body, mixed, shop

__all__ = ["mixed", "shop"]  # the fixtures this module uses

DEEP_BODY = b"[" * 100_000 + b"]" * 100_000


def test_a_body_nested_too_deep_to_decode_is_a_400(shop: Shop, mixed: dict[str, str]) -> None:
    web = api(shop.engine, max_body_bytes=len(DEEP_BODY) + 1)
    message = error(
        web.signal(mixed["waiting"], "approve", json_body(raw=DEEP_BODY)), 400, "invalid_json"
    )
    assert "too deep" in message


@pytest.mark.parametrize("depth", [101, 950])
def test_a_payload_past_the_depth_limit_is_a_400_naming_it(
    shop: Shop, mixed: dict[str, str], depth: int
) -> None:
    body = ("[" * depth + "]" * depth).encode()
    message = error(
        api(shop.engine).signal(mixed["waiting"], "approve", json_body(raw=body)),
        400,
        "invalid_payload",
    )
    assert "max_payload_depth" in message


def test_a_second_signal_with_another_payload_is_a_409(shop: Shop, mixed: dict[str, str]) -> None:
    web = api(shop.engine)
    assert web.signal(mixed["waiting"], "approve", json_body({"by": "ann"})).status == 202
    assert web.signal(mixed["waiting"], "approve", json_body({"by": "ann"})).status == 202
    message = error(
        web.signal(mixed["waiting"], "approve", json_body({"by": "bob"})),
        409,
        "signal_already_sent",
    )
    assert "already has signal 'approve'" in message
