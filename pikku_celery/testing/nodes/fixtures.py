"""The fixtures with which pikku's plugin replaces pytest-celery's Docker components.

pytest-celery's fixture graph stays as it is (``celery_setup`` from the
worker, broker and backend clusters, each cluster from its node fixtures);
what is replaced is the bottom of it, where a Docker container was made:

* ``default_redis_broker``, ``default_redis_backend``: a key prefix of their
  own on a running Redis; ``default_rabbitmq_broker``: a virtual host on a
  running RabbitMQ (see :mod:`.services`);
* ``default_worker_container``: a local ``celery worker`` process running
  the setup's app (its settings, ``default_worker_tasks`` and
  ``default_worker_signals`` modules) (see :mod:`.worker`, :mod:`.app`);
* the node fixtures, ``default_worker_cls`` and ``celery_setup_cls``, for
  the node classes of :mod:`.api`.

And pikku's own: ``celery_setup_pikku``, a Pikku on the setup's app with a
scratch store whose workflows run on the setup's workers, and
``celery_worker_node_factory``, which starts more worker nodes of the same
setup (for a :class:`~pytest_celery.CeleryWorkerCluster` of several).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from celery import Celery
from pytest_celery import CeleryBackendCluster, CeleryBrokerCluster, CeleryTestSetup

from .api import (
    LocalRabbitMQTestBroker,
    LocalRedisTestBackend,
    LocalRedisTestBroker,
    LocalTestSetup,
    LocalTestWorker,
)
from .app import CONFIG_ENV, changed_settings, install_all, write_node_config
from .services import (
    LocalRabbitMQContainer,
    LocalRedisContainer,
    RabbitMQVhost,
    amqp_url_in_vhost,
)
from .settings import NodeSettings
from .store import scratch_database
from .worker import LocalWorkerContainer

if TYPE_CHECKING:
    from pikku_celery import Pikku

NODE_APP = "pikku_celery.testing.nodes.app"
PIKKU_FIXTURE = "celery_setup_pikku"
WorkerFactory = Callable[..., LocalTestWorker]


# --- settings ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def local_node_settings(pytestconfig: pytest.Config) -> NodeSettings:
    """The servers and store the local nodes use (ini options or environment)."""
    return NodeSettings.from_config(pytestconfig)


# --- setup ---------------------------------------------------------------------------


@pytest.fixture
def celery_setup_cls() -> type[CeleryTestSetup]:
    return LocalTestSetup


def _cluster_config(
    request: pytest.FixtureRequest, name: str, default: dict[str, Any]
) -> dict[str, Any] | None:
    try:
        cluster = request.getfixturevalue(name)
    except pytest.fail.Exception:
        return default
    if not cluster:
        return None
    config: dict[str, Any] = cluster.config()
    options = cluster[0].config().get("transport_options")
    if options:
        config["transport_options"] = options
    return config


@pytest.fixture
def celery_broker_cluster_config(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """The broker cluster's URLs, and its first node's transport options."""
    return _cluster_config(request, "celery_broker_cluster", CeleryBrokerCluster.default_config())


@pytest.fixture
def celery_backend_cluster_config(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """The backend cluster's URLs, and its first node's transport options."""
    return _cluster_config(request, "celery_backend_cluster", CeleryBackendCluster.default_config())


@pytest.fixture
def celery_setup_pikku_lease() -> float:
    """Seconds of a step's lease in pikku's setups (the Redis visibility timeout
    and the RabbitMQ default lease): short, so a killed worker's step is taken
    over within the test."""
    return 4.0


@pytest.fixture
def celery_setup_config(
    request: pytest.FixtureRequest,
    celery_setup_cls: type[CeleryTestSetup],
    celery_worker_cluster_config: dict[str, Any],
) -> dict[str, Any]:
    """pytest-celery's setup settings; with ``celery_setup_pikku``, also a short
    visibility timeout (``celery_setup_pikku_lease``) and one message per
    worker process at a time."""
    config: dict[str, Any] = celery_setup_cls.config(
        celery_worker_cluster_config=celery_worker_cluster_config
    )
    if PIKKU_FIXTURE in request.fixturenames:
        lease = request.getfixturevalue("celery_setup_pikku_lease")
        config["broker_transport_options"] = {
            "visibility_timeout": lease,
            **config.get("broker_transport_options", {}),
        }
        config.setdefault("worker_prefetch_multiplier", 1)
    return config


# --- brokers and backends --------------------------------------------------------


@pytest.fixture
def default_redis_broker(local_node_settings: NodeSettings) -> Iterator[LocalRedisContainer]:
    """A key prefix on the running Redis; its keys are deleted after the test."""
    container = LocalRedisContainer(local_node_settings.redis_url)
    container.ready()
    yield container
    container.teardown()


@pytest.fixture
def celery_redis_broker(
    default_redis_broker: LocalRedisContainer,
) -> Iterator[LocalRedisTestBroker]:
    broker = LocalRedisTestBroker(default_redis_broker)
    yield broker
    broker.teardown()


@pytest.fixture
def default_redis_backend(local_node_settings: NodeSettings) -> Iterator[LocalRedisContainer]:
    """A key prefix on the running Redis for results; deleted after the test."""
    container = LocalRedisContainer(local_node_settings.redis_url)
    container.ready()
    yield container
    container.teardown()


@pytest.fixture
def celery_redis_backend(
    default_redis_backend: LocalRedisContainer,
) -> Iterator[LocalRedisTestBackend]:
    backend = LocalRedisTestBackend(default_redis_backend)
    yield backend
    backend.teardown()


@pytest.fixture(scope="session")
def local_rabbitmq_url(local_node_settings: NodeSettings) -> Iterator[str]:
    """The RabbitMQ URL of this session's nodes: a virtual host of the session's
    own (made with ``rabbitmqctl``, deleted after) when it can be made."""
    url = local_node_settings.amqp_url
    if local_node_settings.rabbitmq_vhost == "auto" and RabbitMQVhost.available():
        from kombu.utils.url import url_to_parts

        user = url_to_parts(url).username or "guest"
        vhost = RabbitMQVhost(f"pikku_nodes_{uuid.uuid4().hex[:10]}", user)
        try:
            vhost.create()
        except Exception:
            yield url  # not ours to manage (no rights, remote server): the URL's own
            return
        try:
            yield amqp_url_in_vhost(url, vhost.name)
        finally:
            vhost.delete()
    else:
        yield url


@pytest.fixture
def default_rabbitmq_broker(local_rabbitmq_url: str) -> Iterator[LocalRabbitMQContainer]:
    """The session's RabbitMQ virtual host; the test's worker queues are deleted after it."""
    container = LocalRabbitMQContainer(local_rabbitmq_url)
    container.ready()
    yield container
    container.teardown()


@pytest.fixture
def celery_rabbitmq_broker(
    default_rabbitmq_broker: LocalRabbitMQContainer,
) -> Iterator[LocalRabbitMQTestBroker]:
    broker = LocalRabbitMQTestBroker(default_rabbitmq_broker)
    yield broker
    broker.teardown()


# --- workers ---------------------------------------------------------------------


@pytest.fixture
def default_worker_cls() -> type[LocalTestWorker]:
    return LocalTestWorker


@pytest.fixture
def local_worker_options() -> dict[str, Any]:
    """Keyword arguments of each worker node's :class:`LocalWorkerContainer`
    (``concurrency``, ``pool``, ``queues``, ``extra_args``, ``env``, ...)."""
    return {"concurrency": 1, "pool": "prefork"}


@pytest.fixture
def celery_setup_pikku_options() -> dict[str, Any]:
    """Options of the setup's Pikku (here and in its workers): quick sweeps."""
    return {
        "sweep_interval": 1.0,
        "sweep_backoff": 0.5,
        "sweep_lease_ttl": 1.0,
        "message_grace": 3.0,
        "idle_after": 3.0,
    }


@pytest.fixture
def celery_setup_pikku_installers(local_node_settings: NodeSettings) -> list[str]:
    """What registers the setup Pikku's workflows, here and in each worker
    (``pikku_celery_workflows``): ``"module:function"`` installers called with
    the Pikku, or ``"module"`` / ``"module:pikku"`` naming your own module whose
    ``@pikku.workflow`` functions are registered as they are (see
    :func:`~pikku_celery.testing.nodes.app.installer`)."""
    return list(local_node_settings.workflows)


@pytest.fixture(scope="session")
def celery_pikku_database(local_node_settings: NodeSettings) -> Iterator[str]:
    """The URL of this session's scratch pikku store (migrated; dropped after)."""
    with scratch_database(local_node_settings.database) as url:
        yield url


@pytest.fixture
def local_worker_pikku(request: pytest.FixtureRequest) -> dict[str, Any] | None:
    """The Pikku each worker node builds, when the test uses ``celery_setup_pikku``."""
    if PIKKU_FIXTURE not in request.fixturenames:
        return None
    options = dict(request.getfixturevalue("celery_setup_pikku_options"))
    options.setdefault("default_lease", request.getfixturevalue("celery_setup_pikku_lease"))
    return {
        "database_url": request.getfixturevalue("celery_pikku_database"),
        "options": options,
        "installers": list(request.getfixturevalue("celery_setup_pikku_installers")),
    }


def _module_names(modules: set[ModuleType] | None) -> list[str]:
    return sorted(m.__name__ for m in modules or ())


@pytest.fixture
def celery_worker_node_factory(
    pytestconfig: pytest.Config,
    tmp_path: Path,
    default_worker_cls: type[LocalTestWorker],
    default_worker_app: Celery,
    default_worker_tasks: set[ModuleType],
    default_worker_signals: set[ModuleType],
    local_worker_options: dict[str, Any],
    local_worker_pikku: dict[str, Any] | None,
) -> Iterator[WorkerFactory]:
    """Start a worker node of the setup (same app, tasks, Pikku) and return it ready.

    Keyword arguments override ``local_worker_options`` for that node. Every
    node made is torn down (SIGKILL) after the test.
    """
    made: list[LocalTestWorker] = []
    main = default_worker_app.main or "celery_test_app"
    config = write_node_config(
        tmp_path / f"node-config-{uuid.uuid4().hex[:8]}.json",
        main=main,
        settings=changed_settings(default_worker_app),
        modules=[*_module_names(default_worker_tasks), *_module_names(default_worker_signals)],
        pikku=local_worker_pikku,
    )

    def make(**overrides: Any) -> LocalTestWorker:
        options = {**local_worker_options, **overrides}
        options.setdefault("queues", [default_worker_app.conf.task_default_queue])
        env = {**options.pop("env", {}), CONFIG_ENV: str(config)}
        extra = list(options.pop("extra_args", []))
        log_path = tmp_path / f"worker-{len(made)}.log"
        if local_worker_pikku is not None and "-B" not in extra and "--beat" not in extra:
            # pikku's sweep runs from beat: each node runs one (sweeps overlap safely)
            extra += ["-B", "-s", str(log_path.with_suffix(".schedule"))]
        container = LocalWorkerContainer(
            NODE_APP,
            env=env,
            log_path=log_path,
            cwd=pytestconfig.rootpath,
            extra_args=extra,
            **options,
        )
        node = default_worker_cls(container=container, app=default_worker_app)
        made.append(node)
        container.start()
        container.ready()
        return node

    try:
        yield make
    finally:
        for node in made:
            node.teardown()


@pytest.fixture
def default_worker_container(celery_worker_node_factory: WorkerFactory) -> LocalWorkerContainer:
    """The setup's worker: a local ``celery worker`` running the setup's app."""
    return celery_worker_node_factory().container


# --- pikku -----------------------------------------------------------------------


@pytest.fixture
def celery_setup_pikku(
    celery_setup: CeleryTestSetup, local_worker_pikku: dict[str, Any] | None
) -> Iterator[Pikku]:
    """A Pikku on the setup's app and the session's scratch store, with the
    workflows of ``celery_setup_pikku_installers``: its runs are taken by the
    setup's workers, which build the same Pikku."""
    from pikku_celery import Pikku

    assert local_worker_pikku is not None  # this fixture asks for it
    pikku = Pikku(
        celery_setup.app, local_worker_pikku["database_url"], **local_worker_pikku["options"]
    )
    install_all(pikku, local_worker_pikku["installers"])
    yield pikku
    if pikku.sql_engine is not None:
        pikku.sql_engine.dispose()
