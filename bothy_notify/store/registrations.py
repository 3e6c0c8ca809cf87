"""Push registrations and the devices they belong to.

A registration is unique on (provider, token). Registering a known token
refreshes it, restores it after invalidation (errors cleared), and moves it to
the caller when another person held it (the device changed hands).
Invalidated registrations are kept as evidence until
``push.invalidated_retention`` and are never sent to.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bothy_notify.kernel.ids import new_id
from bothy_notify.store.db import Conn

_COLUMNS = (
    "id, user_id, device_id, provider, token, environment, app_id, signing_key, created_at,"
    " renewed_at, last_seen_at, last_error_at, last_error, failure_count, invalidated_at"
)


@dataclass(frozen=True, slots=True)
class Registration:
    """A stored registration. Its repr shows neither token nor signing key nor IDs."""

    id: str
    user_id: str
    device_id: str
    provider: str
    token: str
    environment: str | None
    app_id: str | None
    signing_key: str | None
    created_at: datetime
    renewed_at: datetime
    last_seen_at: datetime | None
    last_error_at: datetime | None
    last_error: str | None
    failure_count: int
    invalidated_at: datetime | None

    @property
    def state(self) -> str:
        return "invalidated" if self.invalidated_at is not None else "active"

    def public(self) -> dict[str, Any]:
        """The API answer (SPEC section 9): no token, no signing key; absent members omitted."""
        out: dict[str, Any] = {"id": self.id, "provider": self.provider}
        if self.environment is not None:
            out["environment"] = self.environment
        out["state"] = self.state
        out["created_at"] = _iso(self.created_at)
        if self.last_seen_at is not None:
            out["last_seen_at"] = _iso(self.last_seen_at)
        if self.last_error is not None:
            out["last_error"] = self.last_error
        return out

    def __repr__(self) -> str:
        return f"Registration(provider={self.provider!r}, state={self.state!r})"


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def upsert(
    conn: Conn,
    *,
    user_id: str,
    device_id: str,
    provider: str,
    token: str,
    environment: str | None,
    app_id: str | None,
    signing_key: str | None,
    now: datetime,
) -> tuple[Registration, bool]:
    """Store or refresh a registration; return it and whether it is new."""
    row = conn.execute(
        f"INSERT INTO bothy.push_registrations ({_COLUMNS})"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, NULL, 0, NULL)"
        " ON CONFLICT (provider, token) DO UPDATE SET"
        "  user_id = EXCLUDED.user_id, device_id = EXCLUDED.device_id,"
        "  environment = EXCLUDED.environment, app_id = EXCLUDED.app_id,"
        "  signing_key = EXCLUDED.signing_key, renewed_at = EXCLUDED.renewed_at,"
        "  invalidated_at = NULL,"
        "  failure_count = CASE WHEN bothy.push_registrations.invalidated_at IS NULL"
        "    AND bothy.push_registrations.user_id = EXCLUDED.user_id"
        "    THEN bothy.push_registrations.failure_count ELSE 0 END,"
        "  last_error = CASE WHEN bothy.push_registrations.invalidated_at IS NULL"
        "    AND bothy.push_registrations.user_id = EXCLUDED.user_id"
        "    THEN bothy.push_registrations.last_error END,"
        "  last_error_at = CASE WHEN bothy.push_registrations.invalidated_at IS NULL"
        "    AND bothy.push_registrations.user_id = EXCLUDED.user_id"
        "    THEN bothy.push_registrations.last_error_at END"
        f" RETURNING {_COLUMNS}, (xmax = 0) AS inserted",
        (new_id(), user_id, device_id, provider, token, environment, app_id, signing_key, now, now),
    ).fetchone()
    assert row is not None
    return Registration(*row[:-1]), bool(row[-1])


def list_for(conn: Conn, user_id: str) -> list[Registration]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM bothy.push_registrations WHERE user_id = %s"
        " ORDER BY created_at, id",
        (user_id,),
    ).fetchall()
    return [Registration(*r) for r in rows]


def delete(conn: Conn, user_id: str, registration_id: str) -> bool:
    """Delete the caller's registration; ``False`` when it is not theirs or gone."""
    return (
        conn.execute(
            "DELETE FROM bothy.push_registrations WHERE id = %s AND user_id = %s",
            (registration_id, user_id),
        ).rowcount
        > 0
    )


def load(conn: Conn, ids: Collection[str]) -> dict[str, tuple[Registration, str]]:
    """Registrations by id with their device's platform."""
    if not ids:
        return {}
    cols = ", ".join(f"r.{c.strip()}" for c in _COLUMNS.split(","))
    rows = conn.execute(
        f"SELECT {cols}, coalesce(d.platform, 'web') FROM bothy.push_registrations r"
        " LEFT JOIN bothy.devices d ON d.device_id = r.device_id WHERE r.id = ANY(%s)",
        (list(ids),),
    ).fetchall()
    return {r[0]: (Registration(*r[:-1]), r[-1]) for r in rows}


def mark_delivered(conn: Conn, registration_id: str, now: datetime) -> None:
    conn.execute(
        "UPDATE bothy.push_registrations SET last_seen_at = %s, failure_count = 0 WHERE id = %s",
        (now, registration_id),
    )


def mark_delivered_many(conn: Conn, registration_ids: list[str], now: datetime) -> None:
    """:func:`mark_delivered` for many registrations in one statement."""
    conn.execute(
        "UPDATE bothy.push_registrations SET last_seen_at = %s, failure_count = 0"
        " WHERE id = ANY(%s)",
        (now, registration_ids),
    )


def mark_dead(conn: Conn, registration_id: str, reason: str, now: datetime) -> None:
    conn.execute(
        "UPDATE bothy.push_registrations SET invalidated_at = coalesce(invalidated_at, %s),"
        " last_error = %s, last_error_at = %s WHERE id = %s",
        (now, reason, now, registration_id),
    )


def mark_error(conn: Conn, registration_id: str, reason: str, now: datetime) -> None:
    """Record a mismatch or rejection: kept, no strike."""
    conn.execute(
        "UPDATE bothy.push_registrations SET last_error = %s, last_error_at = %s WHERE id = %s",
        (reason, now, registration_id),
    )


def add_strike(
    conn: Conn, registration_id: str, reason: str, max_strikes: int, now: datetime
) -> bool:
    """Count a transient failure; invalidate at ``max_strikes`` in a row. Returns whether
    it was invalidated now."""
    row = conn.execute(
        "UPDATE bothy.push_registrations SET failure_count = failure_count + 1,"
        " last_error = %s, last_error_at = %s,"
        " invalidated_at = CASE WHEN failure_count + 1 >= %s THEN coalesce(invalidated_at, %s)"
        "   ELSE invalidated_at END"
        " WHERE id = %s RETURNING failure_count >= %s AND invalidated_at = %s",
        (reason, now, max_strikes, now, registration_id, max_strikes, now),
    ).fetchone()
    return bool(row and row[0])


def sweep_unrenewed(conn: Conn, now: datetime, ttl: timedelta) -> int:
    """Invalidate registrations not registered again within ``ttl``."""
    return conn.execute(
        "UPDATE bothy.push_registrations SET invalidated_at = %s, last_error = 'not_renewed',"
        " last_error_at = %s WHERE invalidated_at IS NULL AND renewed_at < %s",
        (now, now, now - ttl),
    ).rowcount


def delete_invalidated(conn: Conn, older_than: datetime) -> int:
    return conn.execute(
        "DELETE FROM bothy.push_registrations WHERE invalidated_at < %s", (older_than,)
    ).rowcount


def ensure_device(
    conn: Conn, *, user_id: str, device_id: str, platform: str, principal_kind: str
) -> str:
    """Create or update the device row from a token's claims; return its state.

    A revoked device stays revoked (the caller refuses it). The person's row is
    created when unknown (a human, active), so a registering person can be reached
    before the app has sent ``user.upserted``; the app's own upsert wins later.
    """
    conn.execute(
        "INSERT INTO bothy.users (user_id, kind, active) VALUES (%s, %s, true)"
        " ON CONFLICT (user_id) DO NOTHING",
        (user_id, {"user": "human"}.get(principal_kind, principal_kind)),
    )
    row = conn.execute(
        "INSERT INTO bothy.devices (device_id, user_id, platform, state)"
        " VALUES (%s, %s, %s, 'active')"
        " ON CONFLICT (device_id) DO UPDATE SET"
        "  user_id = CASE WHEN bothy.devices.state = 'revoked' THEN bothy.devices.user_id"
        "    ELSE EXCLUDED.user_id END,"
        "  platform = CASE WHEN bothy.devices.state = 'revoked' THEN bothy.devices.platform"
        "    ELSE EXCLUDED.platform END,"
        "  updated_at = now()"
        " RETURNING state",
        (device_id, user_id, platform),
    ).fetchone()
    assert row is not None
    return str(row[0])
