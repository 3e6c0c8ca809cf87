"""The data files the daemon reads at run time, as package data.

``schemas/`` (event schemas, the config schema, the OpenAPI contract) and
``config/bothy-notify.example.toml`` are read through :mod:`importlib.resources`,
so they are found wherever the package is installed (a wheel in any virtualenv,
a zip, an editable checkout), never by a path relative to the source tree.

Where the files really are: SPEC section 3 puts ``schemas/`` and ``config/`` at
the top of the repository, where producers, docs and every branch edit them.
They stay there, and ``bothy_notify/resources/schemas`` and ``.../config`` are
git-tracked symbolic links to them (``../../schemas``, ``../../config``). One
copy of each file exists, so nothing can drift; setuptools follows the links
when it builds, so the sdist and the wheel carry real files (the install check,
``tests/install/smoke.py``, builds both and compares what the wheel installed
with the top-level files). A checkout on a filesystem without symbolic links is
not supported.

Migrations belong to the store: ``bothy_notify/store/migrations``, read the
same way by :func:`bothy_notify.store.migrate.migration_files`.
"""

from __future__ import annotations

import json
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any


def schemas() -> Traversable:
    """The ``schemas`` directory: ``events/*.json``, ``config.schema.json``, ``openapi.yaml``."""
    return files(__name__) / "schemas"


def event_schema_files() -> list[Traversable]:
    """Every event type's JSON schema file, sorted by name (``user.upserted.json``, ...)."""
    directory = schemas() / "events"
    return sorted(
        (item for item in directory.iterdir() if item.name.endswith(".json")),
        key=lambda item: item.name,
    )


def event_schemas() -> dict[str, dict[str, Any]]:
    """Every event type's JSON schema, by type name."""
    return {
        item.name.removesuffix(".json"): json.loads(item.read_text(encoding="utf-8"))
        for item in event_schema_files()
    }


def config_schema() -> dict[str, Any]:
    """``schemas/config.schema.json``: the JSON schema of the configuration file."""
    loaded: dict[str, Any] = json.loads(
        (schemas() / "config.schema.json").read_text(encoding="utf-8")
    )
    return loaded


def example_config_text() -> str:
    """``config/bothy-notify.example.toml``: every key documented, with its default."""
    return (files(__name__) / "config" / "bothy-notify.example.toml").read_text(encoding="utf-8")
