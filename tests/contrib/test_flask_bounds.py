"""The Flask mount answers a body nested too deep with a 400, not a 500."""

from __future__ import annotations

from flask.testing import FlaskClient

from .test_flask import client, permissions, pikku, start

__all__ = ["client", "permissions", "pikku"]  # the fixtures this module uses


def test_a_signal_body_nested_too_deep_is_a_400(client: FlaskClient) -> None:
    run_id = start(client).json["id"]
    codes = {150: {"invalid_payload"}, 950: {"invalid_payload", "invalid_json"}}
    codes[100_000] = {"invalid_json"}  # too deep for the decoder itself
    for depth, expected in codes.items():
        response = client.post(
            f"/api/runs/{run_id}/signals/approval",
            data="[" * depth + "]" * depth,
            content_type="application/json",
        )
        assert response.status_code == 400, depth
        assert response.json["error"] in expected, depth
