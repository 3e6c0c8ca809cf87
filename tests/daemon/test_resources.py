"""The daemon reads its data files as package data; in a checkout they are the
repository's top-level ``schemas/`` and ``config/`` files themselves (the
install check, ``tests/install/smoke.py``, proves the same for a built wheel)."""

from __future__ import annotations

import json

from bothy_notify import resources
from bothy_notify.store.migrate import migration_files
from tests.support.repo import CONFIG_DIR, EVENT_SCHEMA_DIR, ROOT, SCHEMA_DIR


def test_every_event_schema_file_is_package_data() -> None:
    on_disk = {
        p.name.removesuffix(".json"): json.loads(p.read_text())
        for p in EVENT_SCHEMA_DIR.glob("*.json")
    }
    assert resources.event_schemas() == on_disk


def test_the_config_schema_and_the_example_are_package_data() -> None:
    assert resources.config_schema() == json.loads((SCHEMA_DIR / "config.schema.json").read_text())
    example = (CONFIG_DIR / "bothy-notify.example.toml").read_text(encoding="utf-8")
    assert resources.example_config_text() == example


def test_migrations_are_package_data_in_order() -> None:
    names = [item.name for item in migration_files()]
    on_disk = sorted(p.name for p in (ROOT / "bothy_notify" / "store" / "migrations").glob("*.sql"))
    assert names == on_disk and names[0].startswith("0001_")
