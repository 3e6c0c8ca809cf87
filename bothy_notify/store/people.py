"""People as the projection knows them (``user.upserted``), and admitting a
device token's claims: the one rule the HTTP API and the gateway share."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from bothy_notify.store import registrations
from bothy_notify.store.db import Conn

DEACTIVATED = "deactivated"
"""What :func:`admit_device` answers for a person the app deactivated."""


def admit_device(
    conn: Conn, *, user_id: str, device_id: str, platform: str, principal_kind: str
) -> str:
    """Admit a device token's claims: :data:`DEACTIVATED` (nothing written) when the
    app deactivated the person, else the device's state after creating or
    updating its row (``revoked`` means refuse; see
    :func:`bothy_notify.store.registrations.ensure_device`)."""
    return admit_devices(conn, [(user_id, device_id, platform, principal_kind)])[0].state


def admit_devices(
    conn: Conn, claims: Sequence[registrations.DeviceClaim]
) -> list[registrations.DeviceRow]:
    """:func:`admit_device` for many tokens' claims (person, device id, platform,
    principal kind) in three statements: each one's row (its state and 4029
    cooldown), in order."""
    inactive = inactive_among(conn, {c[0] for c in claims})
    rows = registrations.ensure_devices(conn, [c for c in claims if c[0] not in inactive])
    refused = registrations.DeviceRow(DEACTIVATED)
    return [refused if c[0] in inactive else rows[(c[0], c[1])] for c in claims]


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
