"""The Celery app a local worker node of pikku's pytest plugin runs.

``celery -A pikku_celery.testing.nodes.app worker`` with
``PIKKU_CELERY_NODE_CONFIG`` naming a JSON file written by
:func:`write_node_config`: the setup app's name and changed settings, the
modules to import (tasks, signal handlers), and optionally a Pikku to build
on the app (its database and options) with the installers that register its
workflows: ``install(pikku)`` functions, or the modules where your workflows
are already defined on your own Pikku (``@pikku.workflow`` at module level),
whose workflows it registers as they are. It is what pytest-celery's worker
image does with its generated ``app.py``, without an image: the modules are
imported from the project, as the test process imports them.

Importing this module without that variable builds nothing.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery import Celery

CONFIG_ENV = "PIKKU_CELERY_NODE_CONFIG"


def installer(spec: str) -> Callable[[Any], Any]:
    """What registers workflows on the Pikku it is given, from ``spec``:

    * ``"package.module:function"``: that function, called with the Pikku;
    * ``"package.module:attr"`` naming a Pikku: the workflows registered on
      it (your module-level ``@pikku.workflow`` functions, as they are);
    * ``"package.module"``: its ``install`` function if it has one, else the
      workflows of the one Pikku the module holds (defined or imported there).
    """
    from ...engine.core import WorkflowEngine

    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    if not attr and not hasattr(module, "install"):
        engines = {id(v): v for v in vars(module).values() if isinstance(v, WorkflowEngine)}
        if len(engines) != 1:
            raise LookupError(
                f"{spec!r}: {module_name} has no install() and "
                f"{'several Pikku instances' if engines else 'no Pikku'}: name one, "
                f"{module_name}:ATTR, or give it an install(pikku) function"
            )
        [source] = engines.values()
        return functools.partial(adopt_workflows, source)
    try:
        found = getattr(module, attr or "install")
    except AttributeError:
        raise LookupError(f"{spec!r}: {module_name} has no {attr or 'install'}") from None
    if isinstance(found, WorkflowEngine):
        return functools.partial(adopt_workflows, found)
    if not callable(found):
        raise TypeError(f"{spec!r} is neither a function nor a Pikku")
    return found  # type: ignore[no-any-return]


def adopt_workflows(source: Any, target: Any) -> None:
    """Register every workflow of ``source`` (a Pikku) on ``target`` as it is:
    same function, name, version and options. The module's own objects stay
    bound to ``source``; start them on ``target`` with ``target.start(workflow,
    input)``, which finds them by name. A name ``target`` has already (pikku's
    own, or an earlier installer's) keeps its registration."""
    for name in source.registry.names():
        if target.registry.known(name):
            continue
        for workflow in reversed(source.registry.versions(name)):  # oldest first
            adopted = target.workflow(
                workflow.fn,
                name=workflow.name,
                eager_steps=workflow.eager_steps,
                version=workflow.version if workflow.pinned else None,
            )
            adopted.by_name_refusal = workflow.by_name_refusal


def install_all(pikku: Any, installers: Iterable[str]) -> None:
    """Run each installer on ``pikku``, in order."""
    for spec in installers:
        installer(spec)(pikku)


def changed_settings(app: Celery) -> dict[str, Any]:
    """The settings of ``app`` that differ from Celery's defaults (wherever they
    were set: ``config_from_object``, ``conf.update``, the constructor)."""
    from celery.app.defaults import DEFAULTS

    missing = object()
    return {
        key: value
        for key, value in app.conf.items()
        if key != "deprecated_settings" and DEFAULTS.get(key, missing) != value
    }


def jsonable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a worker can be given as JSON (a timedelta as its seconds);
    a value that is not JSON is refused."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, timedelta):
            value = value.total_seconds()
        try:
            json.dumps(value)
        except TypeError:
            raise TypeError(
                f"the setup app's setting {key}={value!r} is not JSON: a local worker node "
                "gets its settings as JSON (set it in the worker's own app module instead)"
            ) from None
        out[key] = value
    return out


def write_node_config(
    path: Path,
    *,
    main: str,
    settings: dict[str, Any],
    modules: Iterable[str] = (),
    pikku: dict[str, Any] | None = None,
) -> Path:
    """Write what :func:`build` reads (``pikku``: database_url, options, installers)."""
    config = {
        "main": main,
        "settings": jsonable_settings(settings),
        "modules": list(modules),
        "pikku": pikku,
    }
    path.write_text(json.dumps(config, indent=2))
    return path


def build(path: Path) -> tuple[Celery, Any]:
    """The app (and the Pikku, or None) that the node configuration at ``path`` describes."""
    config = json.loads(path.read_text())
    app = Celery(config["main"])
    app.config_from_object(config["settings"])
    for module in config["modules"]:
        importlib.import_module(module)
    pikku = None
    if config.get("pikku"):
        from pikku_celery import Pikku

        spec = config["pikku"]
        pikku = Pikku(app, spec["database_url"], **spec.get("options", {}))
        install_all(pikku, spec.get("installers", []))
    return app, pikku


if os.environ.get(CONFIG_ENV):
    app, pikku = build(Path(os.environ[CONFIG_ENV]))
