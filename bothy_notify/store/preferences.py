"""A person's notification settings: category preferences and follow levels.

``bothy.preferences.categories`` maps a category name to a boolean; ``false``
switches the category off, and a missing row or name means on. Follow levels
live in ``bothy.follows`` and are written through
:func:`bothy_notify.store.projections.set_follow`, the projection of the
``thread.followed`` event, so the API and the event log mean the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping

from psycopg.types.json import Jsonb

from bothy_notify.store.db import Conn


def categories(conn: Conn, user_id: str) -> dict[str, bool]:
    """The stored category switches of ``user_id`` (empty when none are stored)."""
    row = conn.execute(
        "SELECT categories FROM bothy.preferences WHERE user_id = %s", (user_id,)
    ).fetchone()
    stored = row[0] if row else {}
    return {str(k): v for k, v in stored.items() if isinstance(v, bool)}


def update_categories(conn: Conn, user_id: str, changes: Mapping[str, bool]) -> dict[str, bool]:
    """Set the named switches (others keep their value); return every stored switch."""
    row = conn.execute(
        "INSERT INTO bothy.preferences (user_id, categories) VALUES (%s, %s)"
        " ON CONFLICT (user_id) DO UPDATE"
        " SET categories = bothy.preferences.categories || EXCLUDED.categories"
        " RETURNING categories",
        (user_id, Jsonb(dict(changes))),
    ).fetchone()
    assert row is not None
    return {str(k): v for k, v in row[0].items() if isinstance(v, bool)}


def follow_level(conn: Conn, user_id: str, thread_id: str) -> str | None:
    """The stored follow level of ``user_id`` for ``thread_id``, or ``None``."""
    row = conn.execute(
        "SELECT level FROM bothy.follows WHERE thread_id = %s AND user_id = %s",
        (thread_id, user_id),
    ).fetchone()
    return str(row[0]) if row else None
