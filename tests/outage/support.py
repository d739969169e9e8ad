"""Helpers of the outage tests."""

from __future__ import annotations

import sqlalchemy as sa

from tests.lease.tcp_proxy import TcpProxy


def through(proxy: TcpProxy, database: str) -> str:
    """The URL of ``database`` by way of ``proxy``'s line."""
    return sa.make_url(database).set(port=proxy.port).render_as_string(hide_password=False)
