"""Where the local nodes find their servers: pytest ini options or environment variables.

Each setting is read from its environment variable first (CI sets those),
then from its ini option (``[pytest]`` in ``pytest.ini``, or
``[tool.pytest.ini_options]``), then its default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from .services import DEFAULT_AMQP_URL, DEFAULT_REDIS_URL


@dataclass(frozen=True)
class Setting:
    """One plugin setting: its environment variable, its ini option and its default."""

    ini: str
    env: str
    default: str
    help: str


SETTINGS = (
    Setting(
        "pikku_celery_redis_url",
        "PIKKU_CELERY_TEST_REDIS_URL",
        DEFAULT_REDIS_URL,
        "the running Redis that Redis broker and backend nodes use (a key prefix each)",
    ),
    Setting(
        "pikku_celery_amqp_url",
        "PIKKU_CELERY_TEST_AMQP_URL",
        DEFAULT_AMQP_URL,
        "the running RabbitMQ that RabbitMQ broker nodes use",
    ),
    Setting(
        "pikku_celery_rabbitmq_vhost",
        "PIKKU_CELERY_TEST_RABBITMQ_VHOST",
        "auto",
        "auto: a virtual host per test session made with rabbitmqctl (if installed); "
        "url: the URL's own",
    ),
    Setting(
        "pikku_celery_database",
        "PIKKU_CELERY_TEST_DATABASE",
        "sqlite://",
        "where the pikku store's scratch database is made: a PostgreSQL or MySQL URL "
        "(its server), or sqlite:// (a temporary file)",
    ),
    Setting(
        "pikku_celery_workflows",
        "PIKKU_CELERY_TEST_WORKFLOWS",
        "",
        "what registers the workflows of the celery_setup_pikku fixture and its workers, "
        "comma-separated: 'module:function' (an install(pikku) function), 'module:pikku' "
        "(the workflows defined on that Pikku), or 'module' (its install, else the "
        "workflows of the one Pikku it holds)",
    ),
)


@dataclass(frozen=True)
class NodeSettings:
    """Where the plugin's nodes find their services and what the pikku fixture builds."""

    redis_url: str
    amqp_url: str
    rabbitmq_vhost: str
    database: str
    workflows: tuple[str, ...]

    @classmethod
    def from_config(cls, config: pytest.Config) -> NodeSettings:
        """The settings of this session: environment first, then the ini file, then defaults."""
        values: dict[str, str] = {}
        for s in SETTINGS:
            raw = os.environ.get(s.env) or config.getini(s.ini) or s.default
            values[s.ini] = str(raw).strip()
        vhost = values["pikku_celery_rabbitmq_vhost"]
        if vhost not in ("auto", "url"):
            raise pytest.UsageError(
                f"pikku_celery_rabbitmq_vhost = {vhost!r}: expected 'auto' or 'url'"
            )
        workflows = tuple(
            spec.strip()
            for spec in values["pikku_celery_workflows"].replace("\n", ",").split(",")
            if spec.strip()
        )
        return cls(
            redis_url=values["pikku_celery_redis_url"],
            amqp_url=values["pikku_celery_amqp_url"],
            rabbitmq_vhost=vhost,
            database=values["pikku_celery_database"],
            workflows=workflows,
        )


def add_ini_options(parser: pytest.Parser) -> None:
    """Declare the plugin's ini options, so a pytest.ini or pyproject section may set them."""
    for s in SETTINGS:
        parser.addini(s.ini, f"{s.help} (env {s.env}; default {s.default or 'none'})", default="")
