"""A new event type in the database only, as a newer node's migration adds it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from bothy_notify.resources import event_schemas
from bothy_notify.store.eventsql import function_text


def add_event_type(conn: psycopg.Connection[Any], name: str, schema: Mapping[str, Any]) -> None:
    """Make ``bothy.append_event`` accept ``name`` (checked against ``schema``) while the
    running code does not know it: what the generated migration of a newer version
    does (``bothy_notify/store/eventsql.py``)."""
    conn.execute(function_text({**event_schemas(), name: schema}).encode())
