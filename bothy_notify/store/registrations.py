"""Push registrations and the devices they belong to.

A device is identified by (person, device id): two people whose tokens carry
the same device id have a device row each, and a registration belongs to the
device of its own person.

A registration is unique on (provider, owner scope, token): for APNs, FCM and
the fake provider the scope is empty, so registering a known token refreshes
it, restores it after invalidation (errors cleared), and moves it to the
caller when another person held it (the device changed hands); for webhooks
the scope is the person, so a URL never moves between people and a second
person registering the same URL gets a registration (and signing key) of
their own; a Web Push endpoint is unique like a device token but never moves
(``moves=False``: another person registering it is refused with
:class:`RegistrationTaken`). The Matrix gateway's registrations
(:mod:`bothy_notify.store.matrix`) belong to principals of the daemon's own, whose
ids hold a ``/``; their scope is that principal, so they never move either. The
unique index is on the token's SHA-256, so no token length can overflow it.
``signing_key`` holds what a registration keeps beside its token, never
returned: a webhook's signing key, a Web Push subscription's ``p256dh`` and
``auth``, a Matrix relay's gateway URL; ``expires_at`` a registration's own
expiry (a Web Push ``expirationTime``).

A person holds at most ``push.max_registrations_per_person`` registrations:
a new one first makes room by deleting the person's oldest invalidated
registrations, and raises :class:`RegistrationLimitReached` when all are
active. Invalidated registrations are kept as evidence until
``push.invalidated_retention`` and are never sent to.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from bothy_notify.kernel.ids import new_id
from bothy_notify.kernel.values import fast_init
from bothy_notify.store.db import Conn

_COLUMNS = (
    "id, user_id, device_id, provider, token, environment, app_id, signing_key, created_at,"
    " renewed_at, last_seen_at, last_error_at, last_error, failure_count, invalidated_at,"
    " last_strike_at, expires_at"
)
_WEBHOOK = "webhook"
"""The provider whose tokens (URLs) are scoped to their person."""
_PERSON_LOCK = 0x6274_7267  # "btrg": registrations of one person, with hashtext(user_id).
_DELIVERY_STAMP_GRANULARITY = timedelta(seconds=1)
"""``provider_deliveries`` moves at most this often, so result batches of many nodes
rarely wait on its row (a strike decision needs far coarser time)."""


@fast_init
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
    last_strike_at: datetime | None = None
    expires_at: datetime | None = None

    @property
    def state(self) -> str:
        return "invalidated" if self.invalidated_at is not None else "active"

    @property
    def error_since_delivery(self) -> str | None:
        """``last_error`` when it is newer than the latest delivery, else ``None``."""
        if self.last_error is None or self.last_error_at is None:
            return None
        if self.last_seen_at is not None and self.last_seen_at >= self.last_error_at:
            return None
        return self.last_error

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


class Change(enum.StrEnum):
    """What registering did."""

    CREATED = "created"
    """A new registration (answered 201)."""
    MOVED = "moved"
    """A device token another person held now belongs to the caller."""
    RESTORED = "restored"
    """The caller's invalidated registration is active again, its errors cleared."""
    REFRESHED = "refreshed"
    """The caller's active registration was registered again (renewed)."""


@dataclass(frozen=True, slots=True)
class Registered:
    """The result of :func:`upsert`: the registration, what changed, and how many of
    the person's invalidated registrations were deleted to make room."""

    registration: Registration
    change: Change
    evicted: int = 0

    @property
    def created(self) -> bool:
        return self.change is Change.CREATED


class RegistrationLimitReached(Exception):
    """The person already holds ``push.max_registrations_per_person`` active registrations."""


class RegistrationTaken(Exception):
    """The token is another person's and does not move between people (Web Push)."""


def owner_scope(provider: str, user_id: str) -> str:
    """The owner part of a registration's unique key (see the module docstring), as
    the generated column computes it: the person for a webhook, and the principal for
    one of the daemon's own (an id with a ``/``: the Matrix gateway's)."""
    return user_id if provider == _WEBHOOK or "/" in user_id else ""


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
    max_per_person: int | None = None,
    expires_at: datetime | None = None,
    moves: bool = True,
) -> Registered:
    """Store, refresh, restore or take over a registration (in the caller's transaction).

    A registration new to the caller (created, or moved from another person)
    counts against ``max_per_person``; registering one of the caller's own
    tokens again never does. Raises :class:`RegistrationLimitReached` (the
    caller rolls back) when the limit is reached and no invalidated
    registration of the person can make room, and :class:`RegistrationTaken`
    when the token is another person's and ``moves`` is false.
    """
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_PERSON_LOCK, user_id))
    scope = owner_scope(provider, user_id)
    fields = (device_id, environment, app_id, signing_key, now, expires_at)
    while True:
        found = conn.execute(
            f"SELECT {_COLUMNS} FROM bothy.push_registrations WHERE provider = %s"
            " AND owner_scope = %s AND token_digest = sha256(convert_to(%s, 'UTF8'))"
            " FOR UPDATE",
            (provider, scope, token),
        ).fetchone()
        if found is not None:
            existing = Registration(*found)
            if existing.user_id == user_id:
                restored = existing.invalidated_at is not None
                change = Change.RESTORED if restored else Change.REFRESHED
                renewed = _renew(conn, existing.id, user_id, fields, clear=restored)
                return Registered(renewed, change)
            if not moves:
                raise RegistrationTaken
            evicted = _make_room(conn, user_id, max_per_person)
            moved = _renew(conn, existing.id, user_id, fields, clear=True)
            return Registered(moved, Change.MOVED, evicted)
        evicted = _make_room(conn, user_id, max_per_person)
        row = conn.execute(
            f"INSERT INTO bothy.push_registrations ({_COLUMNS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, NULL, NULL, NULL, 0, NULL, NULL,"
            " %s) ON CONFLICT (provider, owner_scope, token_digest) DO NOTHING"
            f" RETURNING {_COLUMNS}",
            (new_id(), user_id, device_id, provider, token, *fields[1:4], now, now, expires_at),
        ).fetchone()
        if row is not None:
            return Registered(Registration(*row), Change.CREATED, evicted)
        # Another person registered the same device token at this moment: it is
        # committed now, so the next look finds it and takes it over.


def _renew(
    conn: Conn,
    registration_id: str,
    user_id: str,
    fields: tuple[str, str | None, str | None, str | None, datetime, datetime | None],
    *,
    clear: bool,
) -> Registration:
    """Register a known registration again for ``user_id``; ``clear`` starts it afresh
    (active, no errors, no strikes)."""
    device_id, environment, app_id, signing_key, now, expires_at = fields
    reset = (
        ", invalidated_at = NULL, failure_count = 0, last_error = NULL, last_error_at = NULL,"
        " last_strike_at = NULL"
        if clear
        else ""
    )
    row = conn.execute(
        "UPDATE bothy.push_registrations SET user_id = %s, device_id = %s, environment = %s,"
        f" app_id = %s, signing_key = %s, renewed_at = %s, expires_at = %s{reset} WHERE id = %s"
        f" RETURNING {_COLUMNS}",
        (user_id, device_id, environment, app_id, signing_key, now, expires_at, registration_id),
    ).fetchone()
    assert row is not None
    return Registration(*row)


def _make_room(conn: Conn, user_id: str, limit: int | None) -> int:
    """Delete the person's oldest invalidated registrations so one more fits under
    ``limit``; returns how many. Raises :class:`RegistrationLimitReached` when the
    active ones alone fill it."""
    if limit is None:
        return 0
    row = conn.execute(
        "SELECT count(*) FROM bothy.push_registrations WHERE user_id = %s", (user_id,)
    ).fetchone()
    held = int(row[0]) if row else 0
    excess = held - limit + 1
    if excess <= 0:
        return 0
    deleted = conn.execute(
        "DELETE FROM bothy.push_registrations WHERE id IN ("
        " SELECT id FROM bothy.push_registrations WHERE user_id = %s"
        " AND invalidated_at IS NOT NULL ORDER BY invalidated_at, id LIMIT %s)",
        (user_id, excess),
    ).rowcount
    if deleted < excess:
        raise RegistrationLimitReached
    return deleted


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
        # The ids as one JSON array, made an array on the server, and the device per
        # registration: the planner, which cannot count the array, reads both by
        # key at any count (given the true count it scanned both tables of 10,000
        # registrations for a claimed batch of 200; see notify/facts.py).
        f"SELECT {cols}, coalesce(d.platform, 'web') FROM bothy.push_registrations r"
        " LEFT JOIN LATERAL (SELECT d.platform FROM bothy.devices d"
        "  WHERE d.user_id = r.user_id AND d.device_id = r.device_id OFFSET 0) d ON true"
        " WHERE r.id = ANY(ARRAY(SELECT json_array_elements_text(%s::json)))",
        (orjson.dumps(list(ids)).decode(),),
    ).fetchall()
    return {r[0]: (Registration(*r[:-1]), r[-1]) for r in rows}


def mark_delivered_many(conn: Conn, delivered: list[tuple[str, str]], now: datetime) -> None:
    """Deliveries of many ``(registration_id, provider)``: each
    registration's ``last_seen_at`` set and strikes reset, and each provider's latest
    delivery (``provider_deliveries``) moved forward."""
    if not delivered:
        return
    conn.execute(
        "UPDATE bothy.push_registrations SET last_seen_at = %s, failure_count = 0,"
        " last_strike_at = NULL WHERE id = ANY(%s)",
        (now, [registration_id for registration_id, _provider in delivered]),
    )
    providers = sorted({provider for _registration_id, provider in delivered})
    # A provider row is written at most once per granule and never waited for: a row
    # another transaction is stamping (with about the same time) is skipped, so result
    # batches of several nodes never queue or deadlock behind it. Only the very first
    # delivery of a provider inserts its row.
    conn.execute(
        "INSERT INTO bothy.provider_deliveries (provider, delivered_at)"
        " SELECT unnest(%s::text[]), %s ON CONFLICT (provider) DO NOTHING",
        (providers, now),
    )
    conn.execute(
        "UPDATE bothy.provider_deliveries SET delivered_at = %s WHERE provider IN ("
        " SELECT provider FROM bothy.provider_deliveries WHERE provider = ANY(%s)"
        " AND delivered_at < %s FOR UPDATE SKIP LOCKED)",
        (now, providers, now - _DELIVERY_STAMP_GRANULARITY),
    )


def mark_dead(conn: Conn, registration_id: str, reason: str, now: datetime) -> bool:
    """Invalidate (kept as evidence); returns whether it was active until now."""
    return (
        conn.execute(
            "UPDATE bothy.push_registrations SET invalidated_at = %s, last_error = %s,"
            " last_error_at = %s WHERE id = %s AND invalidated_at IS NULL",
            (now, reason, now, registration_id),
        ).rowcount
        > 0
    )


def mark_error(conn: Conn, registration_id: str, reason: str, now: datetime) -> None:
    """Record an error that keeps the registration: a mismatch, a rejection, a transient
    attempt, or a failed send that counts no strike."""
    conn.execute(
        "UPDATE bothy.push_registrations SET last_error = %s, last_error_at = %s WHERE id = %s",
        (reason, now, registration_id),
    )


def mark_errors_many(conn: Conn, errors: list[tuple[str, str]], now: datetime) -> None:
    """:func:`mark_error` for many ``(registration_id, reason)`` in one statement."""
    if errors:
        conn.execute(
            "UPDATE bothy.push_registrations r SET last_error = e.reason, last_error_at = %s"
            " FROM unnest(%s::text[], %s::text[]) AS e(id, reason) WHERE r.id = e.id",
            (now, [e[0] for e in errors], [e[1] for e in errors]),
        )


@dataclass(frozen=True, slots=True)
class StrikeState:
    """What the strike rules read about a registration and its provider.

    Attributes:
        active: not invalidated.
        strikes: strikes in a row so far (``failure_count``).
        last_strike_at: when the latest of them counted.
        last_seen_at: the registration's latest delivery.
        provider_delivered_at: the provider's latest delivery to any registration.
    """

    active: bool
    strikes: int
    last_strike_at: datetime | None
    last_seen_at: datetime | None
    provider_delivered_at: datetime | None


def strike_state(conn: Conn, registration_id: str) -> StrikeState | None:
    """Lock the registration and read its :class:`StrikeState` (``None`` when gone)."""
    row = conn.execute(
        "SELECT r.invalidated_at IS NULL, r.failure_count, r.last_strike_at, r.last_seen_at,"
        " p.delivered_at FROM bothy.push_registrations r"
        " LEFT JOIN bothy.provider_deliveries p ON p.provider = r.provider"
        " WHERE r.id = %s FOR UPDATE OF r",
        (registration_id,),
    ).fetchone()
    return StrikeState(*row) if row is not None else None


def add_strike(
    conn: Conn, registration_id: str, reason: str, now: datetime, *, invalidate: bool
) -> None:
    """Count one strike (the error recorded); ``invalidate`` when it is the last one allowed."""
    conn.execute(
        "UPDATE bothy.push_registrations SET failure_count = failure_count + 1,"
        " last_strike_at = %s, last_error = %s, last_error_at = %s,"
        " invalidated_at = CASE WHEN %s THEN coalesce(invalidated_at, %s) ELSE invalidated_at END"
        " WHERE id = %s",
        (now, reason, now, invalidate, now, registration_id),
    )


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
    """Create or update the person's device row from a token's claims; return its state.

    The row is the person's own (key: person and device id), so another person
    whose token carries the same device id never touches it. A revoked device
    stays revoked (the caller refuses it). The person's row is created when
    unknown (a human, active), so a registering person can be reached before
    the app has sent ``user.upserted``; the app's own upsert wins later.
    """
    rows = ensure_devices(conn, [(user_id, device_id, platform, principal_kind)])
    return rows[(user_id, device_id)].state


DeviceClaim = tuple[str, str, str, str]
"""(person, device id, platform, principal kind) of one device token."""


@dataclass(frozen=True, slots=True)
class DeviceRow:
    """A device's row as an identify finds it: its state, and the seconds left of its
    4029 cooldown (0: none; see :func:`start_cooldown`)."""

    state: str
    cooling: float = 0.0


def ensure_devices(conn: Conn, claims: Sequence[DeviceClaim]) -> dict[tuple[str, str], DeviceRow]:
    """:func:`ensure_device` for many tokens in two statements: each device's row by
    (person, device id).

    Rows are written in key order, so two concurrent calls lock them in the same
    order. A device named twice takes its last claim's platform; a person's row
    is created with the kind of their first claim.
    """
    if not claims:
        return {}
    devices = {(c[0], c[1]): c[2] for c in claims}
    kinds: dict[str, str] = {}
    for user_id, _device_id, _platform, principal_kind in claims:
        kinds.setdefault(user_id, {"user": "human"}.get(principal_kind, principal_kind))
    conn.execute(
        "INSERT INTO bothy.users (user_id, kind, active)"
        " SELECT u, k, true FROM json_to_recordset(%s::json) AS x(u text, k text) ORDER BY u"
        " ON CONFLICT (user_id) DO NOTHING",
        (json.dumps([{"u": u, "k": k} for u, k in kinds.items()]),),
    )
    rows = conn.execute(
        "INSERT INTO bothy.devices (device_id, user_id, platform, state)"
        " SELECT d, u, p, 'active'"
        " FROM json_to_recordset(%s::json) AS x(u text, d text, p text) ORDER BY u, d"
        " ON CONFLICT (user_id, device_id) DO UPDATE SET"
        "  platform = CASE WHEN bothy.devices.state = 'revoked' THEN bothy.devices.platform"
        "    ELSE EXCLUDED.platform END,"
        "  updated_at = now()"
        " RETURNING user_id, device_id, state,"
        "  coalesce(extract(epoch FROM cooldown_until - now()), 0)::float8",
        (json.dumps([{"u": u, "d": d, "p": p} for (u, d), p in devices.items()]),),
    ).fetchall()
    return {(str(r[0]), str(r[1])): DeviceRow(str(r[2]), max(0.0, float(r[3]))) for r in rows}


def start_cooldown(conn: Conn, *, user_id: str, device_id: str, seconds: float) -> None:
    """Refuse the device at identify for ``seconds`` from now, on every process and node
    (a 4029 close): the end is kept on the device's row, in the database's clock."""
    conn.execute(
        "UPDATE bothy.devices SET cooldown_until = now() + make_interval(secs => %s)"
        " WHERE user_id = %s AND device_id = %s",
        (seconds, user_id, device_id),
    )
