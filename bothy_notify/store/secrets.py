"""The secret store: provider credentials in PostgreSQL, referenced as ``secret:NAME``.

Setting a name again retires the old value (kept, so a mistyped paste can be
recovered from the table by an operator) and makes the new one current.
Reading a missing secret returns ``None``; nothing is ever invented, except the
keys the daemon makes for itself (:func:`ensure`: the thread grouping key).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from bothy_notify.store.db import Conn

NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
MAX_VALUE_BYTES = 65_536
"""Largest secret value: a service-account JSON is a few KB, a .p8 key a few hundred bytes."""


@dataclass(frozen=True, slots=True)
class StoredSecret:
    """What ``secret set`` may show: the length and last four characters only."""

    name: str
    length: int
    last_four: str
    retired_previous: bool

    def __repr__(self) -> str:
        return f"StoredSecret(name={self.name!r}, length={self.length})"


def get(conn: Conn, name: str) -> str | None:
    row = conn.execute(
        "SELECT value FROM bothy.secrets WHERE name = %s AND retired_at IS NULL", (name,)
    ).fetchone()
    return str(row[0]) if row else None


def put(conn: Conn, name: str, value: str) -> StoredSecret:
    """Store ``value`` as the current secret ``name``, retiring the previous one."""
    retired = conn.execute(
        "UPDATE bothy.secrets SET retired_at = now() WHERE name = %s AND retired_at IS NULL",
        (name,),
    ).rowcount
    conn.execute("INSERT INTO bothy.secrets (name, value) VALUES (%s, %s)", (name, value))
    return StoredSecret(name, len(value), value[-4:] if len(value) >= 8 else "", retired > 0)


def ensure(conn: Conn, name: str, make: Callable[[], str]) -> str:
    """The current secret ``name``; a new one from ``make`` stored first when there is
    none (a secret the daemon makes itself, such as the thread grouping key). Safe
    when several processes start at once: they all read the one that was stored."""
    conn.execute(
        "INSERT INTO bothy.secrets (name, value) VALUES (%s, %s)"
        " ON CONFLICT (name) WHERE retired_at IS NULL DO NOTHING",
        (name, make()),
    )
    found = get(conn, name)
    assert found is not None  # stored above, or by whoever was first
    return found
