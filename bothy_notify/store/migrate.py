"""Plain SQL migrations, applied in order and recorded; safe to run twice.

Files live in ``bothy_notify/store/migrations/NNNN_name.sql`` (package data, read
through :mod:`importlib.resources`, so an installed wheel finds them). Each runs in its
own transaction together with its row in ``bothy.schema_migrations``. A
transaction-scoped advisory lock serialises nodes that start at once. After the
migrations, the event schemas of ``schemas/events`` (package data, see
:mod:`bothy_notify.resources`) are synchronised into ``bothy.event_types``, which
``bothy.append_event`` validates against.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from psycopg.types.json import Jsonb

from bothy_notify import resources
from bothy_notify.store.db import Conn

log = logging.getLogger("bothy.store.migrate")

_LOCK_KEY = 0x6274_6D67  # "btmg": the migration lock, distinct from the round's lock.


@dataclass(frozen=True)
class MigrationResult:
    applied: tuple[str, ...]
    already: tuple[str, ...]


def migration_files() -> list[Traversable]:
    """The migration files (``NNNN_name.sql``) in the order they apply."""
    directory = files("bothy_notify.store") / "migrations"
    return sorted(
        (item for item in directory.iterdir() if item.name.endswith(".sql")),
        key=lambda item: item.name,
    )


def load_event_schemas() -> dict[str, dict[str, Any]]:
    """Every event type's JSON schema, by type name."""
    return resources.event_schemas()


def migrate(conn: Conn, progress: Callable[[str], None] | None = None) -> MigrationResult:
    """Apply every pending migration on ``conn`` (autocommit off) and sync event types."""
    applied: list[str] = []
    already: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE SCHEMA IF NOT EXISTS bothy")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bothy.schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM bothy.schema_migrations")}
        for path in migration_files():
            version = path.name.removesuffix(".sql")
            if version in done:
                already.append(version)
                continue
            if progress is not None:
                progress(f"applying migration {version}")
            log.info("applying migration", extra={"migration": version})
            conn.execute(path.read_text(encoding="utf-8").encode())
            conn.execute("INSERT INTO bothy.schema_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
        for name, schema in load_event_schemas().items():
            conn.execute(
                "INSERT INTO bothy.event_types (type, schema) VALUES (%s, %s)"
                " ON CONFLICT (type) DO UPDATE SET schema = EXCLUDED.schema",
                (name, Jsonb(schema)),
            )
    return MigrationResult(tuple(applied), tuple(already))
