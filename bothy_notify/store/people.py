"""People as the projection knows them (``user.upserted``)."""

from __future__ import annotations

from collections.abc import Collection

from bothy_notify.store.db import Conn


def is_active(conn: Conn, user_id: str) -> bool:
    """Whether the app has not deactivated ``user_id``.

    A person the projection does not know yet counts as active: a device may
    register before the app sends ``user.upserted``.
    """
    row = conn.execute("SELECT active FROM bothy.users WHERE user_id = %s", (user_id,)).fetchone()
    return row is None or bool(row[0])


def inactive_among(conn: Conn, user_ids: Collection[str]) -> set[str]:
    """The people among ``user_ids`` whom the app deactivated."""
    if not user_ids:
        return set()
    rows = conn.execute(
        "SELECT user_id FROM bothy.users WHERE NOT active AND user_id = ANY(%s)",
        (list(user_ids),),
    ).fetchall()
    return {str(r[0]) for r in rows}
