"""Plain SQL migrations, applied in order and recorded; safe to run twice.

Files live in ``bothy_notify/store/migrations/NNNN_name.sql`` (package data, read
through :mod:`importlib.resources`, so an installed wheel finds them). Each runs in its
own transaction together with its row in ``bothy.schema_migrations``. A
transaction-scoped advisory lock serialises nodes that start at once. The event
schemas of ``schemas/events`` reach the database as a migration too: the check
of ``bothy.append_event`` is generated from them (:mod:`bothy_notify.store.eventsql`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

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
    """Apply every pending migration on ``conn`` (autocommit off)."""
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
    return MigrationResult(tuple(applied), tuple(already))
